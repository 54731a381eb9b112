import { AgentEnvError } from "../../errors.ts";

/**
 * Errors of the disk service. Codes: `disk.bad_spec` (invalid disk description),
 * `disk.open_failed` (a backing file cannot be opened), `disk.read_only` (write to a read-only
 * image), `disk.out_of_range` (I/O beyond the virtual size), `disk.serve_failed` (the export
 * child exited or did not become ready in time; details hold its stderr tail), `disk.io_failed`.
 */
export class DiskError extends AgentEnvError {}
