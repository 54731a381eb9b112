/**
 * A node's local repository kept in step with an object store (S3Repository):
 * - push after commit: every published snapshot of a pushed kind is queued and pushed in the
 *   background (one at a time, in commit order); a marker `remote/<id>` records it is stored;
 * - `sync()` (at start and every sync interval) queues committed snapshots of those kinds that
 *   carry no marker: a push a crash or a store failure cut short is done again;
 * - `open(id)`: a snapshot this node lacks is looked up in the store and its manifest adopted
 *   (layers come later, with `acquire`);
 * - `acquire(layers)`: the layer cache fetches missing layers (digest-checked) and holds them;
 * - a snapshot deleted here (tombstoned or removed) that the store holds because of this node
 *   (pushed, or adopted from it) is deleted there too (its manifest; layers stay, other
 *   snapshots may name them).
 */
import { existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { logger } from "../observability/log.ts";
import type { LayerCache, LayerHold } from "./cache.ts";
import type { LocalRepository } from "./local.ts";
import { layersOf, SNAPSHOT_ID_RE, type LayerRef, type SnapshotKind, type SnapshotManifest } from "./manifest.ts";
import type { PushReport, S3Repository } from "./s3.ts";
import { orLate } from "../util/timeout.ts";

const log = logger("snapshot.remote");

/** Settings of the remote side of a repository. */
export interface SnapshotRemoteOptions {
  /** Kinds pushed after commit. */
  pushKinds: readonly SnapshotKind[];
  /** Period of `sync()`; 0 = only when called. ms. */
  syncIntervalMs: number;
  /** Longest wait of `close()` for queued pushes, ms. */
  shutdownWaitMs: number;
}

/** The object store of a node's snapshots, its push queue and its local layer cache. */
export class SnapshotRemote {
  private queue: Promise<void> = Promise.resolve();
  private readonly queued = new Set<string>();
  private timer: ReturnType<typeof setInterval> | undefined;
  private closed = false;
  private readonly markers: string;
  /** Pushes done by this process (tests and benchmarks read them). */
  readonly pushes: PushReport[] = [];
  /** Push failures since start (each is tried again by the next sync). */
  pushFailures = 0;

  constructor(
    private readonly repo: LocalRepository,
    readonly store: S3Repository,
    readonly cache: LayerCache,
    private readonly opts: SnapshotRemoteOptions,
  ) {
    this.markers = join(repo.root, "remote");
    mkdirSync(this.markers, { recursive: true });
  }

  /** Run `sync()` now and every sync interval until `close()`. */
  start(): void {
    void this.sync();
    if (this.opts.syncIntervalMs > 0) this.timer = setInterval(() => void this.sync(), this.opts.syncIntervalMs);
  }

  /** Listener for `LocalRepository` `onPublish`: queue a push of a snapshot of a pushed kind. */
  published(m: SnapshotManifest): void {
    if (this.opts.pushKinds.includes(m.kind)) this.enqueue(m.id);
  }

  /** Listener for `LocalRepository` `onDelete`: delete the store's copy when this node put or found it there. */
  deleted(id: string): void {
    if (!SNAPSHOT_ID_RE.test(id) || !existsSync(this.marker(id))) return;
    this.chain(async () => {
      if (!existsSync(this.marker(id))) return;
      try {
        await this.store.deleteManifest(id);
        rmSync(this.marker(id), { force: true });
        log.info({ id, store: this.store.location }, "snapshot deleted from the object store");
      } catch (e) {
        log.error({ err: e, id }, "deleting a snapshot from the object store failed (its marker stays; delete it there by hand)");
      }
    });
  }

  /** Whether the store holds `id` because of this node (pushed or adopted). */
  isStored(id: string): boolean {
    return SNAPSHOT_ID_RE.test(id) && existsSync(this.marker(id));
  }

  /**
   * Queue a push of every committed snapshot of a pushed kind that the store does not hold yet,
   * and a delete of the store's copy of every snapshot deleted here while that could not run
   * (marker without manifest). @returns the ids queued for a push
   */
  async sync(): Promise<string[]> {
    const out: string[] = [];
    let list: SnapshotManifest[];
    try {
      list = this.repo.list();
    } catch (e) {
      log.error({ err: e }, "listing local snapshots for the object store failed");
      return out;
    }
    const have = new Set(list.map((m) => m.id));
    for (const f of readdirSync(this.markers)) if (!have.has(f) && !this.repo.find(f)) this.deleted(f);
    for (const m of list) {
      if (!this.opts.pushKinds.includes(m.kind) || existsSync(this.marker(m.id))) continue;
      if (this.enqueue(m.id)) out.push(m.id);
    }
    return out;
  }

  /**
   * The manifest of `id` from the local repository, else from the store (then adopted: it is a
   * local snapshot whose layers `acquire` fetches). @returns undefined when neither has it
   * @throws SnapshotError `snapshot.remote_failed`, `snapshot.bad_manifest`
   */
  async open(id: string): Promise<SnapshotManifest | undefined> {
    const local = this.repo.find(id);
    if (local) return this.repo.isTombstoned(id) ? undefined : local;
    const m = await this.store.getManifest(id);
    if (!m) return undefined;
    // another open of the same id may have adopted it meanwhile
    if (!this.repo.find(id)) {
      this.repo.adopt(m);
      writeFileSync(this.marker(id), "");
      log.info({ id, kind: m.kind, layers: layersOf(m).length, store: this.store.location }, "snapshot manifest adopted from the object store");
    }
    return this.repo.find(id);
  }

  /**
   * Hold `layers` for a user (a VM running from them), fetching the missing ones from the store.
   * @throws SnapshotError `snapshot.corrupt_layer`, `snapshot.remote_failed`
   */
  acquire(layers: readonly LayerRef[]): Promise<LayerHold> {
    return this.cache.acquire(layers);
  }

  /** Resolves when every push and delete queued so far has finished (failed ones included). */
  async flush(): Promise<void> {
    for (;;) {
      const q = this.queue;
      await q;
      if (q === this.queue) return;
    }
  }

  /**
   * Stop the periodic sync and wait for queued pushes, at most `waitMs` (what is left is pushed
   * by the next start's sync).
   */
  async close(waitMs = this.opts.shutdownWaitMs): Promise<void> {
    this.closed = true;
    clearInterval(this.timer);
    const done = await orLate(this.flush().then(() => true), waitMs, false);
    if (!done) log.warn({ queued: [...this.queued], waitMs }, "snapshot pushes still running at shutdown: the next start pushes them");
  }

  private marker(id: string): string {
    return join(this.markers, id);
  }

  /** Queue a push of `id` unless one is queued. @returns whether it was queued */
  private enqueue(id: string): boolean {
    if (this.queued.has(id) || this.closed) return false;
    this.queued.add(id);
    this.chain(async () => {
      try {
        await this.pushNow(id);
      } finally {
        this.queued.delete(id);
      }
    });
    return true;
  }

  private chain(f: () => Promise<void>): void {
    this.queue = this.queue.then(f, f);
  }

  private async pushNow(id: string): Promise<void> {
    const m = this.repo.find(id);
    if (!m || this.repo.isTombstoned(id) || existsSync(this.marker(id))) return;
    try {
      const r = await this.store.push(m, (l) => this.repo.layerPath(l));
      writeFileSync(this.marker(id), "");
      this.pushes.push(r);
      this.cache.noteStored(layersOf(m).map((l) => l.digest));
      // a deletion while the push ran: the store's copy goes too
      if (!this.repo.find(id) || this.repo.isTombstoned(id)) this.deleted(id);
      await this.cache.evict();
    } catch (e) {
      this.pushFailures++;
      log.error({ err: e, id, store: this.store.location }, "snapshot push failed (tried again at the next sync)");
    }
  }
}
