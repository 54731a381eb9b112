/**
 * Volumes: persistent ext4 filesystems inside overlaybd images, attached to sandboxes as extra
 * drives and reachable from the node for the content API.
 * - `createVolumeImage(paths, size, owner, label)`, `volumePaths(dir, id)`, `volumeTarget(paths, readOnly)`
 * - `HostVolume.open(opts, readOnly)` / `repairVolume(opts)` / `reapHostVolumes(root)`
 * - `HostFiles`: the content API's operations on a host mount
 * - `volumePath`: content API paths, canonical and never above the volume's root
 */
export { VolumeError, type VolumeErrorCode } from "./errors.ts";
export type { VolumeEntry, VolumeEntryType, VolumeFiles, VolumeMetadata, VolumeWriteOptions } from "./types.ts";
export { createVolumeImage, volumeTarget, volumePaths, type VolumePaths } from "./image.ts";
export { HostVolume, repairVolume, reapHostVolumes, VOLUME_FILE, type HostVolumeOptions } from "./host.ts";
export { HostFiles, type CreateDefaults } from "./files.ts";
export { volumePath } from "./paths.ts";
