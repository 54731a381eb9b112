import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Errors of the disk service (daemon, its protocol and its images). Adding a code: see src/errors.ts. */
export const DISK_ERRORS = {
  "disk.bad_spec": "an invalid disk description",
  "disk.open_failed": "a backing file cannot be opened (details.path)",
  "disk.read_only": "a write to a read-only image",
  "disk.out_of_range": "I/O beyond the virtual size (details.offset, length)",
  "disk.io_failed": "a read or write of the backing file failed",
  "disk.malformed_frame": "a daemon protocol frame that is not a JSON object",
  "disk.frame_too_large": "a daemon protocol frame longer than max_frame_bytes (details.length, max)",
  "disk.bad_request": "a daemon request of unknown kind or with a bad field (details.field, value)",
  "disk.not_found": "no such device in the daemon (details.devId)",
  "disk.exists": "the device id is taken (details.devId)",
  "disk.unsupported": "engine or operation not available here (details.engine)",
  "disk.busy": "the daemon is shutting down, or another daemon holds its directory",
  "disk.backend_failed": "a part the daemon drives failed with its own code (overlaybd, ublk, FUSE, a system call): details.cause holds it, e.g. overlaybd.bad_magic or ENOENT",
  "disk.internal": "a failure the daemon did not type, or an answer with a code this table lacks (details.cause: that code) (a bug)",
  "disk.daemon_failed": "the daemon did not start, or died with no restarts left (details.log: its log tail)",
  "disk.daemon_unavailable": "the daemon connection dropped before the answer came",
  "disk.timeout": "the daemon did not answer within request_timeout_ms",
} as const satisfies ErrorTable;
/** A DiskError code. */
export type DiskErrorCode = keyof typeof DISK_ERRORS;

/** A failure of this subsystem: one of `DISK_ERRORS` as `code`, the offending values in `details`. */
export class DiskError extends AgentEnvError<DiskErrorCode> {}

/** True when `c` is one of `DISK_ERRORS` (a code the daemon may send). */
export function isDiskErrorCode(c: unknown): c is DiskErrorCode {
  return typeof c === "string" && Object.hasOwn(DISK_ERRORS, c);
}

/**
 * What the daemon answers for a failure: a DiskError as it is; another subsystem's typed error
 * (OverlaybdError, UblkError, FuseError, SyscallError) or a Node system error (ENOENT, ...)
 * as `disk.backend_failed` with its own code in `details.cause` and at the head of the message;
 * anything without a code as `disk.internal`. So every code on the wire is a DiskError code.
 */
export function toDiskError(e: unknown): DiskError {
  if (e instanceof DiskError) return e;
  const err = e instanceof Error ? e : new Error(String(e));
  const code = (err as { code?: unknown }).code;
  const x = err as Partial<NodeJS.ErrnoException> & { details?: Record<string, unknown> };
  const details = x.details ?? (x.syscall === undefined ? {} : { syscall: x.syscall, ...(x.path === undefined ? {} : { path: x.path }) });
  if (isDiskErrorCode(code)) return new DiskError(code, err.message, details, { cause: e });
  if (typeof code === "string" && code !== "") {
    return new DiskError("disk.backend_failed", err.message.startsWith(code) ? err.message : `${code}: ${err.message}`, { ...details, cause: code }, { cause: e });
  }
  return new DiskError("disk.internal", err.message, details, { cause: e });
}
