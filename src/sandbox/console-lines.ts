/**
 * Guest console lines -> sandbox log lines. envd writes its own log to the console as pino JSON
 * (one object per line, `level` 10..60, `msg`, `subsystem` "envd..."), so such a line becomes an
 * `envd` entry with its level and string fields; every other line (kernel, guest init, whatever a
 * program printed on /dev/console) is a `console` entry at level info.
 */
import { Type as T } from "@sinclair/typebox";
import type { LogLevel, SandboxLogLine } from "../orchestrator/types.ts";
import { jsonSchema } from "../util/json-check.ts";

/** One of envd's pino lines (other fields are copied as they are). */
const ENVD_LINE = jsonSchema(T.Intersect([T.Record(T.String(), T.Unknown()), T.Object({ msg: T.String(), subsystem: T.String() })]));

/** pino numeric level -> E2B level (10 trace and 20 debug -> debug, 60 fatal -> error). */
function pinoLevel(n: unknown): LogLevel {
  if (typeof n !== "number") return "info";
  if (n < 30) return "debug";
  if (n < 40) return "info";
  if (n < 50) return "warn";
  return "error";
}

/** Fields of envd's JSON lines that are not copied into `fields` (they have their own place). */
const OWN_KEYS = new Set(["level", "time", "msg", "pid", "hostname"]);
/** Bound on fields copied from one line, and on each value's length. */
const MAX_FIELDS = 16;
const MAX_FIELD_CHARS = 512;

/**
 * Classify one console line.
 * @param at when the node received it, unix ms
 */
export function consoleLogLine(line: string, at: number): SandboxLogLine {
  const t = line.trimStart();
  if (t.startsWith("{") && t.includes('"msg"')) {
    // not JSON, or not one of envd's lines: an ordinary console line
    const r = ENVD_LINE.parse(t);
    if (r.ok && r.value.subsystem.startsWith("envd")) {
      const o = r.value;
      const fields: Record<string, string> = {};
      for (const [k, v] of Object.entries(o)) {
        if (OWN_KEYS.has(k) || v === null || v === undefined) continue;
        if (Object.keys(fields).length >= MAX_FIELDS) break;
        fields[k] = (typeof v === "string" ? v : JSON.stringify(v)).slice(0, MAX_FIELD_CHARS);
      }
      return { at, level: pinoLevel(o.level), source: "envd", message: o.msg, fields };
    }
  }
  return { at, level: "info", source: "console", message: line };
}
