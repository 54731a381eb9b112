import { AgentEnvError, type ErrorTable } from "../../errors.ts";

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
  "disk.internal": "a failure the daemon did not type (a bug)",
  "disk.daemon_failed": "the daemon did not start, or died with no restarts left (details.log: its log tail)",
  "disk.daemon_unavailable": "the daemon connection dropped before the answer came",
  "disk.timeout": "the daemon did not answer within request_timeout_ms",
} as const satisfies ErrorTable;
/** A DiskError code. */
export type DiskErrorCode = keyof typeof DISK_ERRORS;

/** A failure of this subsystem: one of `DISK_ERRORS` as `code`, the offending values in `details`. */
export class DiskError extends AgentEnvError<DiskErrorCode> {}
