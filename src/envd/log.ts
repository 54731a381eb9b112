/**
 * envd's structured log: JSON lines on stderr in pino's shape (`level` as pino's number, `time`
 * in ms, `pid`, `subsystem`, the bindings, `msg`), so the node reads guest lines as it reads its
 * own. envd does not load pino: in a guest under TCG its import alone costs about a quarter of a
 * second of envd's start. Level from `AENV_LOG_LEVEL` (trace..fatal; default info).
 */
import { writeSync } from "node:fs";

const LEVELS = { trace: 10, debug: 20, info: 30, warn: 40, error: 50, fatal: 60 } as const;
type Level = keyof typeof LEVELS;

/** What envd's modules call (the subset of pino's Logger they use). */
export interface EnvdLogger {
  debug(obj: Record<string, unknown> | string, msg?: string): void;
  info(obj: Record<string, unknown> | string, msg?: string): void;
  warn(obj: Record<string, unknown> | string, msg?: string): void;
  error(obj: Record<string, unknown> | string, msg?: string): void;
}

function errorJson(e: Error): Record<string, unknown> {
  const out: Record<string, unknown> = { type: e.name, message: e.message, stack: e.stack };
  for (const [k, v] of Object.entries(e)) out[k] = v;
  return out;
}

function serialize(_key: string, value: unknown): unknown {
  if (value instanceof Error) return errorJson(value);
  return typeof value === "bigint" ? value.toString() : value;
}

/** A logger tagged with `subsystem` (e.g. `logger("envd.process")`). */
export function logger(subsystem: string): EnvdLogger {
  const min = LEVELS[(process.env.AENV_LOG_LEVEL as Level) ?? "info"] ?? LEVELS.info;
  const at = (level: Level) => (obj: Record<string, unknown> | string, msg?: string) => {
    if (LEVELS[level] < min) return;
    const fields = typeof obj === "string" ? { msg: obj } : { ...obj, ...(msg === undefined ? {} : { msg }) };
    let line: string;
    try {
      line = JSON.stringify({ level: LEVELS[level], time: Date.now(), pid: process.pid, subsystem, ...fields }, serialize);
    } catch {
      line = JSON.stringify({ level: LEVELS[level], time: Date.now(), pid: process.pid, subsystem, msg: String(msg ?? obj) });
    }
    try {
      writeSync(2, `${line}\n`);
    } catch {
      // stderr gone: nothing to tell
    }
  };
  return { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}
