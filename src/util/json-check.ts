/**
 * Reading JSON that comes from outside the process (a guest, a peer, a file another process
 * wrote, a config file) against a TypeBox schema, instead of casting it: the value comes back
 * typed, or with the first thing wrong with it named by its JSON pointer. The caller turns the
 * problem into its own subsystem's typed error. Schemas are compiled (TypeBox's TypeCompiler) on
 * first use, so a module may declare many without paying for them at import.
 */
import type { Static, TSchema } from "@sinclair/typebox";
import { TypeCompiler, type TypeCheck } from "@sinclair/typebox/compiler";

/**
 * What is wrong with a value: where (a JSON pointer, "" for the value itself), why (TypeBox's
 * message), and what was expected there when the failing schema says so in its `description`.
 */
export interface JsonProblem {
  path: string;
  message: string;
  expected?: string;
}

/** The outcome of a check: the typed value, or the first problem found. */
export type Checked<T> = { ok: true; value: T } | { ok: false; problem: JsonProblem };

/** A schema with its compiled check (compiled on first use). */
export class JsonSchema<S extends TSchema> {
  #compiled: TypeCheck<S> | undefined;
  constructor(readonly schema: S) {}

  #check(): TypeCheck<S> {
    return (this.#compiled ??= TypeCompiler.Compile(this.schema));
  }

  /** Whether `v` has the schema's shape. */
  is(v: unknown): v is Static<S> {
    return this.#check().Check(v);
  }

  /** `v` typed, or its first problem. */
  check(v: unknown): Checked<Static<S>> {
    const c = this.#check();
    if (c.Check(v)) return { ok: true, value: v };
    const first = c.Errors(v).First();
    const expected = first?.schema.description;
    return { ok: false, problem: { path: first?.path ?? "", message: first?.message ?? "does not match the schema", ...(expected ? { expected } : {}) } };
  }

  /** `text` parsed as JSON and checked; a text that is not JSON is a problem at the root. */
  parse(text: string): Checked<Static<S>> {
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch (e) {
      return { ok: false, problem: { path: "", message: `not JSON (${e instanceof Error ? e.message : String(e)})` } };
    }
    return this.check(v);
  }
}

/** Shorthand for `new JsonSchema(schema)`. */
export function jsonSchema<S extends TSchema>(schema: S): JsonSchema<S> {
  return new JsonSchema(schema);
}

/** A schema per key, each compiled on first use (e.g. one per message kind). */
export function jsonSchemas<M extends Record<string, TSchema>>(m: M): { [K in keyof M]: JsonSchema<M[K]> } {
  const out: Partial<{ [K in keyof M]: JsonSchema<M[K]> }> = {};
  for (const k of Object.keys(m) as (keyof M)[]) out[k] = new JsonSchema(m[k]);
  return out as { [K in keyof M]: JsonSchema<M[K]> };
}

/** A problem as one phrase for an error message: `"/a/0: Expected string"` (the expectation when known), or the message alone at the root. */
export function describeProblem(p: JsonProblem): string {
  const why = p.expected ?? p.message;
  return p.path ? `${p.path}: ${why}` : why;
}
