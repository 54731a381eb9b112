import { AgentEnvError, type ErrorTable } from "../../errors.ts";

/** Errors of the FUSE export. Adding a code: see src/errors.ts. */
export const FUSE_ERRORS = {
  "fuse.open_device": "/dev/fuse cannot be opened",
  "fuse.mount": "mount(2) refused the FUSE mount (details.errno)",
  "fuse.bad_options": "invalid export options",
  "fuse.closed": "the reader pool or connection is closed",
  "fuse.internal": "an invariant of the FUSE export broke (a bug; details name what was found)",
} as const satisfies ErrorTable;
/** A FuseError code. */
export type FuseErrorCode = keyof typeof FUSE_ERRORS;

/** A failure of this subsystem: one of `FUSE_ERRORS` as `code`, the offending values in `details`. */
export class FuseError extends AgentEnvError<FuseErrorCode> {}
