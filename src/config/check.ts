/**
 * Checking values against the config schema, without a schema library: the keys of
 * src/config/schema.ts are plain JSON Schema objects of a small subset (integer with
 * minimum/maximum/multipleOf, string with minLength/pattern, boolean, a list of strings, one of
 * a set of literals, a map of keys matching a pattern to values, a table of keys), and this module reads exactly that subset. `loadConfig`
 * checks operator files and variables with it, and `agentenv envd --settings` checks the tools
 * drive's `[envd]` section with it against ./envd-section.json (the section's schema, generated),
 * so envd's start loads no schema library (TypeBox and the schema's construction cost it about a
 * tenth of its start-up CPU).
 * test/config/config.test.ts checks that it agrees with TypeBox's Value.Check on every key.
 */
import { ConfigError } from "./errors.ts";

/** Units a numeric key may carry; they appear in the generated documentation and in errors. */
export type ConfigUnit = "ms" | "s" | "h" | "bytes" | "MiB" | "kHz" | "count" | "percent";

/** The JSON Schema keywords the config schema uses (src/config/schema.ts builds no others). */
export interface KeySchema {
  type?: string;
  default?: unknown;
  description?: string;
  minimum?: number;
  maximum?: number;
  multipleOf?: number;
  unit?: string;
  pattern?: string;
  minLength?: number;
  /** One of these literals (`oneOf` keys). */
  anyOf?: readonly { const: unknown }[];
  /** Element schema of a list. */
  items?: KeySchema;
  /** Keys of a table. */
  properties?: Record<string, KeySchema>;
  /** A map key (a table of any keys matching the pattern, each value of the given schema; `map`). */
  patternProperties?: Record<string, KeySchema>;
}

/** Whether `s` is a section (a table of fixed keys), not a key holding a value. */
export function isSection(s: KeySchema): boolean {
  return s.type === "object" && s.properties !== undefined;
}

type Table = Record<string, unknown>;

/** True when `v` is a valid value of the (non-table) key schema `s`. */
export function checkValue(s: KeySchema, v: unknown): boolean {
  if (s.anyOf) return s.anyOf.some((l) => l.const === v);
  switch (s.type) {
    case "integer":
      return (
        typeof v === "number" &&
        Number.isInteger(v) &&
        (s.minimum === undefined || v >= s.minimum) &&
        (s.maximum === undefined || v <= s.maximum) &&
        (s.multipleOf === undefined || v % s.multipleOf === 0)
      );
    case "string":
      return typeof v === "string" && (s.minLength === undefined || v.length >= s.minLength) && (s.pattern === undefined || new RegExp(s.pattern).test(v));
    case "boolean":
      return typeof v === "boolean";
    case "array":
      return Array.isArray(v) && v.every((x) => checkValue(s.items ?? {}, x));
    case "object": {
      // a map key: every key matches the key pattern, every value its schema
      if (typeof v !== "object" || v === null || Array.isArray(v) || !s.patternProperties) return false;
      const [[pattern, value]] = Object.entries(s.patternProperties) as [[string, KeySchema]];
      const re = new RegExp(pattern);
      return Object.entries(v).every(([k, x]) => re.test(k) && checkValue(value, x));
    }
    default:
      return false;
  }
}

/** What a key accepts, in words: `an integer in 1..16 (count)`, `one of "kill", "pause"`, ... */
export function expectation(s: KeySchema): string {
  if (s.anyOf) return `one of ${s.anyOf.map((l) => JSON.stringify(l.const)).join(", ")}`;
  switch (s.type) {
    case "integer": {
      const range = s.maximum !== undefined ? ` in ${s.minimum}..${s.maximum}` : ` >= ${s.minimum}`;
      const mult = s.multipleOf ? `, a multiple of ${s.multipleOf}` : "";
      return `an integer${range}${mult}${s.unit ? ` (${s.unit})` : ""}`;
    }
    case "boolean":
      return "true or false";
    case "array":
      return "a list of strings";
    case "object": {
      const [[pattern, value]] = Object.entries(s.patternProperties ?? { "": {} }) as [[string, KeySchema]];
      return s.patternProperties ? `a table of keys matching /${pattern}/, each ${expectation(value)}` : "a table";
    }
    default:
      return s.pattern ? `a string matching /${s.pattern}/` : s.minLength ? "a non-empty string" : "a string";
  }
}

/** The defaults of every key under `s` (a fresh tree on each call). */
export function defaultsOf(s: KeySchema): unknown {
  if (isSection(s)) {
    const out: Table = {};
    for (const [k, p] of Object.entries(s.properties ?? {})) out[k] = defaultsOf(p);
    return out;
  }
  return structuredClone(s.default);
}

/**
 * Write the keys of `from` into `into` (the tree of table schema `schema`), each checked.
 * @param prefix key path of the table (`"api."`, "" at the root), for errors
 * @param source the file or variable named in errors
 * @throws ConfigError `config.unknown_key`, `config.bad_value`
 */
export function mergeTable(into: Table, schema: KeySchema, from: Table, prefix: string, source: string): void {
  for (const [k, v] of Object.entries(from)) {
    const key = prefix + k;
    const s = schema.properties?.[k];
    if (!s) throw unknownKey(key, source);
    if (isSection(s)) {
      if (typeof v !== "object" || v === null || Array.isArray(v)) throw badValue(key, v, s, source);
      mergeTable(into[k] as Table, s, v as Table, key + ".", source);
    } else {
      if (!checkValue(s, v)) throw badValue(key, v, s, source);
      into[k] = v;
    }
  }
}

/**
 * Section `name` (table schema `schema`) from a parsed JSON value, checked like an operator
 * file: its keys over the section's defaults.
 * @throws ConfigError `config.bad_value` (not a table), `config.unknown_key`, `config.bad_value`
 *   naming `source` and the key
 */
export function sectionFrom(schema: KeySchema, name: string, value: unknown, source: string): Table {
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw badValue(name, value, schema, source);
  const section = defaultsOf(schema) as Table;
  mergeTable(section, schema, value as Table, `${name}.`, source);
  return section;
}

/** The `config.unknown_key` error for `key` (a dotted path) in `source`. */
export function unknownKey(key: string, source: string): ConfigError {
  return new ConfigError("config.unknown_key", `config: ${source}: unknown key ${key}`, { key, source });
}

/** The `config.bad_value` error for `key` = `value` in `source`, saying what `s` accepts. */
export function badValue(key: string, value: unknown, s: KeySchema, source: string): ConfigError {
  const expected = expectation(s);
  return new ConfigError("config.bad_value", `config: ${source}: ${key} = ${JSON.stringify(value)}: expected ${expected}`, { key, value, expected, source });
}
