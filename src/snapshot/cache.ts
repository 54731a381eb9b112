/**
 * The local repository's layers as a cache in front of an object store: `acquire` holds the
 * layers a restore needs, fetching the missing ones (digest-checked, then linked into `layers/`),
 * and keeps the layer files this cache owns under a byte limit by removing the least recently
 * used ones that nothing holds.
 *
 * A layer is only ever removed when all of this is true: no hold of this process (a running
 * sandbox's restore, a commit of this process: `LocalRepository.isPinned`), its file is older than
 * the grace period (another process, e.g. a template build, touches a layer it commits), it has
 * one link (a template's own layer file hard-linked in frees nothing), and the store holds it
 * with the right size (asked when this process did not push or fetch it itself). Recency is kept
 * in memory; at start it is the file's atime.
 */
import { readdirSync, statSync, chmodSync, rmSync, existsSync } from "node:fs";
import { join } from "node:path";
import { logger } from "../observability/log.ts";
import { SnapshotError } from "./errors.ts";
import type { LocalRepository } from "./local.ts";
import { DIGEST_RE, type LayerRef } from "./manifest.ts";
import type { S3Repository } from "./s3.ts";
import { renameDurable } from "../util/durable.ts";

const log = logger("snapshot.cache");

/** Settings of a layer cache. */
export interface LayerCacheOptions {
  /** Bytes of layer files (owned by the cache: one link) to keep; 0 = no limit. */
  maxBytes: number;
  /** Layer files younger than this (mtime) are never removed, ms. */
  graceMs: number;
}

/** Layers held by one user (a running sandbox); `release()` is idempotent. */
export interface LayerHold {
  /** Layers fetched from the store by this acquire, and their bytes. */
  fetched: string[];
  fetchedBytes: number;
  release(): void;
}

/** What an eviction removed. */
export interface EvictReport {
  layers: string[];
  bytes: number;
  /** Owned bytes left, and whether that is still over the limit (everything left is needed). */
  remainingBytes: number;
  overLimit: boolean;
}

/** A layer file of the repository as the cache sees it. */
interface Entry {
  digest: string;
  path: string;
  size: number;
  /** Allocated bytes (sparse layers take less than their size). */
  bytes: number;
  nlink: number;
  mtimeMs: number;
  atimeMs: number;
}

/** Local layer cache of one repository over one object store. */
export class LayerCache {
  private readonly holds = new Map<string, number>();
  private readonly lastUse = new Map<string, number>();
  /** Layers this process knows the store holds (pushed or fetched here). */
  private readonly stored = new Set<string>();
  private readonly inflight = new Map<string, Promise<number>>();
  private clock = 0;

  constructor(
    private readonly repo: LocalRepository,
    private readonly store: S3Repository,
    private readonly opts: LayerCacheOptions,
  ) {}

  /**
   * Hold `refs` and make sure each is in the local repository: missing ones are fetched from the
   * store (checked against their digest before they become visible), then the cache is trimmed
   * to its limit. Release the hold when the layers are no longer needed (the VMM exited).
   * @throws SnapshotError `snapshot.corrupt_layer` (a layer missing from the store, or whose bytes
   *   do not match its digest: nothing of it is kept), `snapshot.remote_failed`; the hold is
   *   released on a throw
   */
  async acquire(refs: readonly LayerRef[]): Promise<LayerHold> {
    const digests = [...new Set(refs.map((r) => r.digest))];
    for (const d of digests) this.holds.set(d, (this.holds.get(d) ?? 0) + 1);
    let released = false;
    const hold: LayerHold = {
      fetched: [],
      fetchedBytes: 0,
      release: () => {
        if (released) return;
        released = true;
        for (const d of digests) {
          const n = (this.holds.get(d) ?? 0) - 1;
          if (n < 0) throw new SnapshotError("snapshot.in_use", `hold count of layer ${d} went negative`, { key: d });
          if (n === 0) this.holds.delete(d);
          else this.holds.set(d, n);
        }
      },
    };
    try {
      const missing = [...new Map(refs.filter((r) => !this.repo.hasLayer(r)).map((r) => [r.digest, r])).values()];
      if (missing.length > 0) {
        // room first, so the limit holds after the fetch when it can
        await this.evict(missing.reduce((a, r) => a + r.size, 0));
        for (const r of missing) {
          const n = await this.fetch(r);
          if (n > 0) {
            hold.fetched.push(r.digest);
            hold.fetchedBytes += n;
          }
        }
      }
      for (const d of digests) this.lastUse.set(d, ++this.clock + Date.now() * 1000);
      if (missing.length > 0) await this.evict();
      return hold;
    } catch (e) {
      hold.release();
      throw e;
    }
  }

  /** Note that the store holds these layers (a push of this process stored them). */
  noteStored(digests: Iterable<string>): void {
    for (const d of digests) this.stored.add(d);
  }

  /** Digests held now (tests and diagnostics). */
  held(): string[] {
    return [...this.holds.keys()].sort();
  }

  /**
   * Remove least recently used layers that may go (see the module comment) until the owned
   * bytes plus `room` fit the limit.
   * @throws SnapshotError `snapshot.remote_failed` (asking the store whether it holds a layer)
   */
  async evict(room = 0, now = Date.now()): Promise<EvictReport> {
    const entries = this.entries();
    let total = entries.reduce((a, e) => a + (e.nlink === 1 ? e.bytes : 0), 0);
    const report: EvictReport = { layers: [], bytes: 0, remainingBytes: total, overLimit: false };
    const max = this.opts.maxBytes;
    if (max === 0 || total + room <= max) return report;
    const candidates = entries
      .filter((e) => e.nlink === 1 && !this.holds.has(e.digest) && !this.repo.isPinned(e.digest) && now - e.mtimeMs >= this.opts.graceMs)
      .sort((a, b) => this.recency(a) - this.recency(b));
    for (const e of candidates) {
      if (total + room <= max) break;
      if (!this.stored.has(e.digest)) {
        if (!(await this.store.hasLayer({ digest: e.digest, size: e.size }))) continue;
        this.stored.add(e.digest);
      }
      // held meanwhile (an acquire ran while we asked the store)
      if (this.holds.has(e.digest) || this.repo.isPinned(e.digest)) continue;
      rmSync(e.path, { force: true });
      this.lastUse.delete(e.digest);
      total -= e.bytes;
      report.layers.push(e.digest);
      report.bytes += e.bytes;
    }
    report.remainingBytes = total;
    report.overLimit = total + room > max;
    if (report.layers.length > 0) log.info({ layers: report.layers.length, bytes: report.bytes, remainingBytes: total, maxBytes: max }, "unused snapshot layers evicted from the local cache");
    if (report.overLimit) log.warn({ remainingBytes: total, room, maxBytes: max }, "snapshot layer cache is over its limit: the rest is in use or not yet in the object store");
    return report;
  }

  /** LRU key: this process's last use, else the file's atime (ms, scaled like lastUse). */
  private recency(e: Entry): number {
    return this.lastUse.get(e.digest) ?? e.atimeMs * 1000;
  }

  private entries(): Entry[] {
    const dir = join(this.repo.root, "layers");
    const out: Entry[] = [];
    for (const f of readdirSync(dir)) {
      const digest = `sha256:${f}`;
      if (!DIGEST_RE.test(digest)) continue;
      const path = join(dir, f);
      try {
        const st = statSync(path);
        out.push({ digest, path, size: st.size, bytes: st.blocks * 512, nlink: st.nlink, mtimeMs: st.mtimeMs, atimeMs: st.atimeMs });
      } catch {
        // removed meanwhile
      }
    }
    return out;
  }

  /**
   * Fetch one layer into the repository; one download per digest at a time (a second caller
   * waits for the first). @returns bytes this call downloaded (0 when it joined another's)
   */
  private fetch(ref: LayerRef): Promise<number> {
    const running = this.inflight.get(ref.digest);
    if (running) return running.then(() => 0);
    const p = this.fetchOnce(ref).finally(() => this.inflight.delete(ref.digest));
    this.inflight.set(ref.digest, p);
    return p;
  }

  private async fetchOnce(ref: LayerRef): Promise<number> {
    const dst = this.repo.layerPath(ref);
    if (existsSync(dst)) return 0;
    // in staging under our pid: a crash mid-fetch leaves a file the repository's gc reaps
    const tmp = join(this.repo.root, "staging", `${process.pid}.fetch-${ref.digest.slice(7, 23)}-${crypto.getRandomValues(new Uint32Array(1))[0]!.toString(36)}`);
    const t0 = performance.now();
    try {
      await this.store.fetchLayer(ref, tmp);
      chmodSync(tmp, 0o444);
      renameDurable(tmp, dst);
    } finally {
      rmSync(tmp, { force: true });
    }
    this.repo.markVerified(ref);
    this.stored.add(ref.digest);
    log.info({ digest: ref.digest, bytes: ref.size, ms: Math.round(performance.now() - t0), store: this.store.location }, "snapshot layer fetched");
    return ref.size;
  }
}
