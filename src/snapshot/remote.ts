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
 * Paused sandboxes that can move between nodes: a pushed `pause` snapshot carrying its sandbox's
 * record (`manifest.sandbox`) is also named by `sandboxes/<sandboxId>.json` in the store, which
 * `findPaused` reads on another node. The store keeps a sandbox's pause snapshot only while it
 * is paused: `unpublish` (it resumed) removes the store's copy and keeps the local one, `forget`
 * (another node holds the sandbox now) lets the local one go without touching the store's.
 * Both mark the snapshot local-only (`remote-local/<id>`): never pushed again.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
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
  /** `remote/<id>`: the store holds `id` because of this node; content: the sandbox id its paused record names, or empty. */
  private readonly markers: string;
  /** `remote-local/<id>`: `id` stays in this repository only (unpublished or forgotten). */
  private readonly localOnly: string;
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
    this.localOnly = join(repo.root, "remote-local");
    mkdirSync(this.markers, { recursive: true });
    mkdirSync(this.localOnly, { recursive: true });
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
    if (!SNAPSHOT_ID_RE.test(id)) return;
    if (!this.repo.find(id)) rmSync(this.localMark(id), { force: true });
    if (!existsSync(this.marker(id))) return;
    this.chain(async () => {
      if (!existsSync(this.marker(id))) return;
      try {
        const sandboxId = this.pausedOf(id);
        if (sandboxId) await this.store.deletePaused(sandboxId, id);
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
   * The pause snapshot paused sandbox `sandboxId` resumes from, as the store names it (its
   * manifest adopted here, its layers fetched later by `acquire`); undefined when the store
   * names none, or names one that carries no record of that sandbox.
   * @throws SnapshotError `snapshot.remote_failed`, `snapshot.bad_manifest`
   */
  async findPaused(sandboxId: string): Promise<SnapshotManifest | undefined> {
    const id = await this.store.getPaused(sandboxId);
    if (!id) return undefined;
    const m = await this.open(id);
    if (!m || m.kind !== "pause" || m.source.sandboxId !== sandboxId || !m.sandbox) {
      log.warn({ sandboxId, snapshotId: id, store: this.store.location }, "the store names a pause snapshot of this sandbox that cannot resume it");
      return undefined;
    }
    return m;
  }

  /**
   * The sandbox paused into `id` runs again (from `id`): the store's copy of `id` and the record
   * naming it go, the local copy stays and is never pushed again (the next pause is a new
   * snapshot). Resolves when done or failed; a failure is logged and tried again by the next sync.
   */
  unpublish(id: string): Promise<void> {
    if (!SNAPSHOT_ID_RE.test(id)) return Promise.resolve();
    writeFileSync(this.localMark(id), "");
    return this.chained(() => this.unpublishNow(id));
  }

  /**
   * Another node holds the sandbox paused into `id` now: the local copy may go without touching
   * the store's (that node may be fetching it, or resumed from it and removes it itself). Resolves
   * once a push of `id` in progress has ended; from then on removing `id` here leaves the store alone.
   */
  forget(id: string): Promise<void> {
    if (!SNAPSHOT_ID_RE.test(id)) return Promise.resolve();
    writeFileSync(this.localMark(id), "");
    return this.chained(async () => {
      rmSync(this.marker(id), { force: true });
      log.info({ id, store: this.store.location }, "snapshot let go here; the store's copy is another node's now");
    });
  }

  private async unpublishNow(id: string): Promise<void> {
    if (!existsSync(this.marker(id))) return;
    try {
      const sandboxId = this.pausedOf(id);
      if (sandboxId) await this.store.deletePaused(sandboxId, id);
      await this.store.deleteManifest(id);
      rmSync(this.marker(id), { force: true });
      log.info({ id, sandboxId, store: this.store.location }, "resumed sandbox's pause snapshot removed from the object store");
    } catch (e) {
      log.error({ err: e, id, store: this.store.location }, "removing a resumed sandbox's pause snapshot from the object store failed (tried again at the next sync)");
    }
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
    for (const f of readdirSync(this.localOnly)) {
      if (!this.repo.find(f)) rmSync(this.localMark(f), { force: true });
      else if (existsSync(this.marker(f))) this.chain(() => this.unpublishNow(f));
    }
    for (const m of list) {
      if (!this.opts.pushKinds.includes(m.kind) || existsSync(this.marker(m.id)) || existsSync(this.localMark(m.id))) continue;
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
      writeFileSync(this.marker(id), pausedRecordOf(m) ?? "");
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

  private localMark(id: string): string {
    return join(this.localOnly, id);
  }

  /**
   * The sandbox whose record in the store named pause snapshot `id` when this node pushed or
   * adopted it, or null (not stored because of this node, or carrying no record).
   */
  recordIn(id: string): string | null {
    return SNAPSHOT_ID_RE.test(id) ? this.pausedOf(id) : null;
  }

  /** The sandbox whose paused record in the store names `id` (from its marker), or null. */
  private pausedOf(id: string): string | null {
    try {
      return readFileSync(this.marker(id), "utf8").trim() || null;
    } catch {
      return null;
    }
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
    void this.chained(f);
  }

  /** Run `f` after everything queued so far; resolves when it has run (it logs its own failures). */
  private chained(f: () => Promise<void>): Promise<void> {
    const run = this.queue.then(f, f);
    this.queue = run.catch((e) => log.error({ err: e }, "object store task failed"));
    return this.queue;
  }

  private async pushNow(id: string): Promise<void> {
    const m = this.repo.find(id);
    if (!m || this.repo.isTombstoned(id) || existsSync(this.marker(id)) || existsSync(this.localMark(id))) return;
    try {
      const r = await this.store.push(m, (l) => this.repo.layerPath(l));
      const sandboxId = pausedRecordOf(m);
      // the record last, once its snapshot is stored; not for a sandbox that resumed meanwhile
      if (sandboxId && !existsSync(this.localMark(id))) await this.store.putPaused(sandboxId, id);
      writeFileSync(this.marker(id), sandboxId ?? "");
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

/** The sandbox a pause snapshot's record lets another node resume, or null. */
function pausedRecordOf(m: SnapshotManifest): string | null {
  return m.kind === "pause" && m.sandbox && m.source.sandboxId ? m.source.sandboxId : null;
}
