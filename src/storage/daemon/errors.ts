import { AgentEnvError, type ErrorTable } from "../../errors.ts";

/** Errors of the disk service. Adding a code: see src/errors.ts. */
export const DISK_ERRORS = {
  "disk.bad_spec": "an invalid disk description",
  "disk.open_failed": "a backing file cannot be opened (details.path)",
  "disk.read_only": "a write to a read-only image",
  "disk.out_of_range": "I/O beyond the virtual size (details.offset, length)",
  "disk.serve_failed": "the export child exited or did not become ready in time (details: its stderr tail)",
  "disk.io_failed": "a read or write of the backing file failed",
} as const satisfies ErrorTable;
/** A DiskError code. */
export type DiskErrorCode = keyof typeof DISK_ERRORS;

/** A failure of this subsystem: one of `DISK_ERRORS` as `code`, the offending values in `details`. */
export class DiskError extends AgentEnvError<DiskErrorCode> {}
