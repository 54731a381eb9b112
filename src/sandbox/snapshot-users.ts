/**
 * Which sandboxes (and build VMs) run from which snapshot. A snapshot in use is never removed
 * under its VMs: a delete tombstones it (hidden at once) and the last user's stop removes it.
 */
import type { LocalRepository, SnapshotManifest } from "../snapshot/index.ts";

/** Users of snapshots, by snapshot id. */
export class SnapshotUsers {
  readonly #users = new Map<string, Set<string>>();

  /**
   * @param repo the node's snapshot repository
   * @param removed called after a snapshot was removed or retired here (collects what it left)
   */
  constructor(
    private readonly repo: LocalRepository,
    private readonly removed: () => void,
  ) {}

  /** Sandbox (or VM) `sandboxId` runs from `snapshotId` from now on. */
  use(snapshotId: string, sandboxId: string): void {
    let s = this.#users.get(snapshotId);
    if (!s) this.#users.set(snapshotId, (s = new Set()));
    s.add(sandboxId);
  }

  /** `sandboxId` no longer runs from `snapshotId`; a tombstoned snapshot without users goes. */
  unuse(snapshotId: string, sandboxId: string): void {
    const s = this.#users.get(snapshotId);
    s?.delete(sandboxId);
    if (s && s.size === 0) this.#users.delete(snapshotId);
    if (!this.#users.has(snapshotId) && this.repo.isTombstoned(snapshotId)) {
      this.repo.remove(snapshotId);
      this.removed();
    }
  }

  /** Whether any VM runs from `snapshotId`. */
  inUse(snapshotId: string): boolean {
    return (this.#users.get(snapshotId)?.size ?? 0) > 0;
  }

  /**
   * Remove snapshot `id` now when nothing runs from it, else tombstone it (removed with its last
   * user). Either way `removed` runs at once: what only serves new starts from it (restore pool
   * VMs, a warm memory image) goes now, not at the next sweep.
   */
  retire(id: string): void {
    if (this.inUse(id)) this.repo.tombstone(id);
    else this.repo.remove(id);
    this.removed();
  }

  /** Remove `base` when it is sandbox `id`'s own pause snapshot (superseded or dead with it). */
  dropOwned(base: SnapshotManifest, id: string): void {
    if (base.kind === "pause" && base.source.sandboxId === id && !this.inUse(base.id)) {
      this.repo.remove(base.id);
      this.removed();
    }
  }

  /**
   * Sandbox `id`, which ran from `base` (and from boot snapshot `bootSnapshot`, when restored
   * from one), runs from neither any more; `base` goes when it was the sandbox's own pause.
   */
  leave(id: string, base: SnapshotManifest | string, bootSnapshot: string | undefined): void {
    const baseId = typeof base === "string" ? base : base.id;
    this.unuse(baseId, id);
    if (bootSnapshot) this.unuse(bootSnapshot, id);
    const m = typeof base === "string" ? this.repo.find(base) : base;
    if (m) this.dropOwned(m, id);
  }
}
