import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Snapshot model, repository and shared-image failures. Adding a code: see src/errors.ts. */
export const SNAPSHOT_ERRORS = {
  "snapshot.not_found": "no such visible snapshot (details.id)",
  "snapshot.bad_manifest": "a manifest that does not parse or misses fields (details.where / path, field)",
  "snapshot.bad_request": "a bad snapshot name, id, digest or setting from a caller (details.name / digest / key)",
  "snapshot.corrupt_layer": "a layer whose bytes do not match its digest, or that is missing (details.digest, path)",
  "snapshot.in_use": "an operation that needs the snapshot or image unused (details.key)",
  "snapshot.commit_failed": "writing a snapshot failed; nothing became visible (details.id / path)",
  "snapshot.too_many_layers": "a disk or memory stack would pass the overlaybd limit of 255 layers (details.layers)",
  "snapshot.remote_failed": "the object store refused or lost a request (details.key, status)",
  "snapshot.bad_config": "[snapshot.s3] settings that cannot work together (details.key, value)",
} as const satisfies ErrorTable;
/** A SnapshotError code. */
export type SnapshotErrorCode = keyof typeof SNAPSHOT_ERRORS;

/** A failure of this subsystem: one of `SNAPSHOT_ERRORS` as `code`, the offending values in `details`. */
export class SnapshotError extends AgentEnvError<SnapshotErrorCode> {}
