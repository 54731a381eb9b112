import pino, { type Logger } from "pino";

/**
 * Process-wide structured logger (pino, JSON lines on stderr so stdout stays free for
 * command output). Level from `AENV_LOG_LEVEL` (default `info`; tests use `warn`).
 */
export const log: Logger = pino(
  { level: process.env.AENV_LOG_LEVEL ?? (process.env.NODE_ENV === "test" ? "warn" : "info"), base: { pid: process.pid } },
  pino.destination({ dest: 2, sync: true }),
);

/** A child logger tagged with the subsystem name, e.g. `logger("net")`. */
export function logger(subsystem: string, bindings: Record<string, unknown> = {}): Logger {
  return log.child({ subsystem, ...bindings });
}
