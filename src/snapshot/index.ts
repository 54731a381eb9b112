/**
 * Snapshots as the unit of state (issue 9): a committed snapshot is a manifest plus
 * content-addressed layer files (root disk overlaybd layers, guest memory overlaybd layers,
 * VMM device state), kept in a repository (local directory; S3-compatible store with a local
 * layer cache). Templates are snapshots, sandboxes are created by restoring one, a pause writes
 * a diff on top of the snapshot the VM runs from, and the memory stack of a snapshot is served
 * read-only once and shared by every VM restored from it (`SharedImages`).
 *
 * ```ts
 * const repo = new LocalRepository("/var/lib/agentenv/snapshots", { verifyDigests: true, gcGraceMs: 600_000 });
 * const txn = repo.begin();
 * await writeMemoryLayer(capture, txn.file("memory"), { size, parentLayers });
 * const mem = txn.addLayer(txn.file("memory"));
 * txn.publish({ ...manifest, memory: { size, layers: [...parent, mem] } });
 * repo.get(id); repo.list(); repo.tombstone(id); repo.remove(id); repo.gc();
 *
 * // with [snapshot.s3]: commits are pushed, missing snapshots and layers fetched from the store
 * const { repo, remote } = openRepository(snapshotConfig(cfg), { evict: true });
 * const m = await remote.open(id);               // local, else adopted from the store
 * const hold = await remote.acquire(layersOf(m)); // fetched (digest-checked) and held
 * hold.release();                                 // the VM is gone: LRU may evict them
 * ```
 * Errors: `SnapshotError` (./errors.ts) with the codes listed there.
 */
export { SNAPSHOT_ERRORS, SnapshotError, type SnapshotErrorCode } from "./errors.ts";
export { snapshotConfig, type S3Settings, type SnapshotConfig } from "./config.ts";
export { openRepository, type OpenedRepository } from "./open.ts";
export { S3Repository, type PushReport } from "./s3.ts";
export { LayerCache, type EvictReport, type LayerCacheOptions, type LayerHold } from "./cache.ts";
export { SnapshotRemote, type SnapshotRemoteOptions } from "./remote.ts";
export {
  DIGEST_RE,
  digestHex,
  layersOf,
  MANIFEST_VERSION,
  newSnapshotId,
  parseManifest,
  SNAPSHOT_ID_RE,
  SNAPSHOT_NAME_RE,
  type LayerRef,
  type SnapshotKind,
  type SnapshotManifest,
} from "./manifest.ts";
export { CommitTxn, hashFile, LocalRepository, type GcReport, type LocalRepositoryOptions } from "./local.ts";
export { SharedImages, type ImageExporter, type ImageLease, type ServedImage, type SharedImageStats } from "./shared.ts";
export { writeMemoryLayer, type MemorySource } from "./memory.ts";
