/**
 * Open a node's snapshot repository from its settings: the local directory, and with
 * `[snapshot.s3]` the object store, its push queue and the local layer cache, wired so that every
 * commit is pushed and every delete reaches the store.
 */
import { LayerCache } from "./cache.ts";
import type { SnapshotConfig } from "./config.ts";
import { LocalRepository } from "./local.ts";
import { SnapshotRemote } from "./remote.ts";
import { S3Repository } from "./s3.ts";

/** A local repository and, when an object store is configured, its remote side. */
export interface OpenedRepository {
  repo: LocalRepository;
  remote: SnapshotRemote | null;
}

/**
 * @param opts.evict whether this process trims the layer cache (the node does; a one-off
 *   command such as `template build-base` must not remove layers the node's sandboxes use)
 * @throws SnapshotError `snapshot.bad_config` is thrown earlier, by `snapshotConfig`
 */
export function openRepository(sc: SnapshotConfig, opts: { evict: boolean }): OpenedRepository {
  let remote: SnapshotRemote | null = null;
  const repo = new LocalRepository(sc.path, {
    verifyDigests: sc.verifyDigests,
    gcGraceMs: sc.gcGraceMs,
    onPublish: (m) => remote?.published(m),
    onDelete: (id) => remote?.deleted(id),
  });
  if (sc.s3) {
    const store = new S3Repository(sc.s3);
    const cache = new LayerCache(repo, store, { maxBytes: opts.evict ? sc.cacheMaxBytes : 0, graceMs: sc.gcGraceMs });
    remote = new SnapshotRemote(repo, store, cache, { pushKinds: sc.s3.pushKinds, syncIntervalMs: sc.s3.syncIntervalMs, shutdownWaitMs: sc.s3.shutdownWaitMs });
  }
  return { repo, remote };
}
