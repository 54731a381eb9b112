/**
 * overlaybd layered block images, byte-compatible with containerd/overlaybd.
 *
 * Typical use:
 * ```ts
 * import { openStack, createUpper, importRaw } from "../storage/overlaybd/index.ts";
 * await importRaw("rootfs.ext4", "rootfs.layer");                       // committed layer
 * await createUpper({ data: "w.data", index: "w.index" }, 0);             // 0 = lower's size
 * const img = await openStack({ lowers: ["rootfs.layer"], upper: { data: "w.data", index: "w.index" } });
 * await img.pread(buf, 0); await img.pwrite(buf, 4096); await img.sync(); await img.close();
 * ```
 * Every failure is an `OverlaybdError` with a stable `code` and `details.file`/`details.offset`.
 */
export { OverlaybdError } from "./errors.ts";
export { type Backend, LocalFile, MemoryBackend, SliceBackend } from "./backend.ts";
export { type HeaderTrailer, type Segment, SECTOR, NULL_UUID, HTFlag } from "./format.ts";
export { openRoLayer, openRoLayerFile, unwrapBlob, type RoLayer } from "./layer.ts";
export { RwLayer } from "./rw.ts";
export { CommittedLayerWriter, writeCommitted, type CommitMeta } from "./commit.ts";
export { LayeredImage, openStack, createUpper, mergeLayers, type StackOptions, type UpperPaths } from "./stack.ts";
export { importChangedRanges, importExtents, importRaw, importSparse, type ImportOptions } from "./import.ts";
export { reflinkOrCopy } from "./reflink.ts";
export { ZFileReader, writeZFile, type ZFileWriteOptions, type ZAlgoName } from "./zfile.ts";
export { openTarMember, tarPrefix } from "./tar.ts";
export { openImageConfig, parseImageConfig, type ImageConfig } from "./imageconfig.ts";
export { compressLayer } from "./compress.ts";
export { BlockCache, type BlockCacheOptions, type CacheStats } from "./cache.ts";
export { RegistryBlob, type RegistryOptions } from "./registry.ts";
export { remoteOpener, findCredentials, type Credentials, type RemoteAccess } from "./remote.ts";
