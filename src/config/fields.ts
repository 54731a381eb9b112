/**
 * The vocabulary of the configuration schema (schema.ts): a key is an `int`, `str`, `bool`,
 * `oneOf`, `list` or `map` with its default, range, unit and doc comment, inside a `section` (a
 * TOML table). The doc comments become config/default.toml's comments.
 */
import { type TLiteral, type TObject, type TProperties, type TUnion, Type as T } from "@sinclair/typebox";
import type { ConfigUnit } from "./check.ts";

/** An integer key in `[min, max]` (`max` omitted: no upper bound). */
export function int(def: number, doc: string, o: { min: number; max?: number; unit?: ConfigUnit; multipleOf?: number }) {
  return T.Integer({ default: def, description: doc, minimum: o.min, ...(o.max === undefined ? {} : { maximum: o.max }), ...(o.unit ? { unit: o.unit } : {}), ...(o.multipleOf ? { multipleOf: o.multipleOf } : {}) });
}

/** A string key; `pattern` (a regular expression source) restricts it when given. */
export function str(def: string, doc: string, o: { pattern?: string; minLength?: number } = {}) {
  return T.String({ default: def, description: doc, ...o });
}

/** A true/false key. */
export function bool(def: boolean, doc: string) {
  return T.Boolean({ default: def, description: doc });
}

/** A key that takes one of a fixed set of strings or numbers. */
export function oneOf<const V extends string | number>(values: readonly V[], def: NoInfer<V>, doc: string): TUnion<TLiteral<V>[]> {
  return T.Union(
    values.map((v) => T.Literal(v)),
    { default: def, description: doc },
  ) as unknown as TUnion<TLiteral<V>[]>;
}

/** A list of strings (from an environment variable: comma-separated). */
export function list(def: string[], doc: string) {
  return T.Array(T.String(), { default: def, description: doc });
}

/**
 * A table of operator-chosen keys matching `keyPattern` (a regular expression source), each
 * holding a list of strings: `[image.registry_mirrors]` "docker.io" = ["..."]. From an environment
 * variable one entry at a time: `AENV__section__key__<entry>=a,b`.
 */
export function map(keyPattern: string, doc: string) {
  return T.Record(T.String({ pattern: keyPattern }), T.Array(T.String()), { default: {}, description: doc, additionalProperties: false });
}

/** A TOML table; unknown keys in it are refused. */
export function section<P extends TProperties>(doc: string, props: P): TObject<P> {
  return T.Object(props, { description: doc, additionalProperties: false });
}

/** Largest bound of a wait in ms: one day (no wait in this node is meant to be longer). */
export const MS_MAX = 86_400_000;
/** One TiB, for byte bounds. */
export const TIB = 1024 ** 4;
