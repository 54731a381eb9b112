import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Failures of the volume subsystem (images, host mounts, file operations). Adding a code: see src/errors.ts. */
export const VOLUME_ERRORS = {
  "volume.bad_path": "a content path with .. or a control character, or leading outside the volume through a symlink (details.path)",
  "volume.path_not_found": "the path (or its directory) does not exist in the volume (details.path)",
  "volume.exists": "the path exists already (details.path)",
  "volume.not_a_directory": "a directory operation on something else (details.path)",
  "volume.is_a_directory": "a file operation on a directory (details.path)",
  "volume.too_many_entries": "a listing above [volumes] max_list_entries (details.path, limit)",
  "volume.read_only": "a change through an access that is read-only (details.path)",
  "volume.image_failed": "making a volume's disk failed (details.dir, step)",
  "volume.mount_failed": "mounting a volume on the node failed (details.volumeId, exitCode)",
  "volume.fsck_failed": "e2fsck found errors it could not correct (details.volumeId, exitCode)",
  "volume.io_failed": "a file operation failed (details.path, errno)",
} as const satisfies ErrorTable;
/** A VolumeError code. */
export type VolumeErrorCode = keyof typeof VOLUME_ERRORS;

/** Errors of the volume subsystem. */
export class VolumeError extends AgentEnvError<VolumeErrorCode> {}
