/**
 * A bounded block cache in front of a slow backend (a registry blob): fixed block size, LRU
 * eviction at a byte limit, concurrent misses for the same block share one fetch, runs of
 * missing blocks are fetched with one read. Sizes in bytes.
 */
import type { Backend } from "./backend.ts";
import { fail } from "./errors.ts";
import { LruMap } from "../../util/lru.ts";

/** Cache counters (blocks and bytes). */
export interface CacheStats {
  hits: number;
  misses: number;
  evictions: number;
  fetches: number;
  fetchedBytes: number;
  cachedBytes: number;
}

/** Options: `blockSize` a power of two >= 512; `capacityBytes` >= one block. */
export interface BlockCacheOptions {
  blockSize: number;
  capacityBytes: number;
}

export class BlockCache implements Backend {
  readonly name: string;
  readonly size: number;
  readonly blockSize: number;
  readonly capacityBytes: number;
  private readonly blocks: LruMap<number, Uint8Array>;
  private readonly inflight = new Map<number, Promise<void>>();
  readonly stats: CacheStats = { hits: 0, misses: 0, evictions: 0, fetches: 0, fetchedBytes: 0, cachedBytes: 0 };

  /** @throws OverlaybdError `bad_option` for a block size that is not a power of two >= 512 or a capacity below one block */
  constructor(readonly inner: Backend, opts: BlockCacheOptions) {
    const bs = opts.blockSize;
    if (!Number.isSafeInteger(bs) || bs < 512 || (bs & (bs - 1)) !== 0) fail("bad_option", `cache block size ${bs} is not a power of two >= 512`, { blockSize: bs });
    if (!(opts.capacityBytes >= bs)) fail("bad_option", `cache capacity ${opts.capacityBytes} is below one block (${bs})`, { capacityBytes: opts.capacityBytes });
    this.name = inner.name;
    this.size = inner.size;
    this.blockSize = bs;
    this.capacityBytes = opts.capacityBytes;
    this.blocks = new LruMap(opts.capacityBytes, { weigh: (b) => b.length, onEvict: () => this.stats.evictions++ });
  }

  private insert(i: number, b: Uint8Array): void {
    if (this.blocks.has(i)) return;
    this.blocks.set(i, b);
    this.stats.cachedBytes = this.blocks.weight;
  }

  /** Fetch blocks [first, last] from the inner backend in one read. */
  private fetchRun(first: number, last: number): Promise<void> {
    const start = first * this.blockSize;
    const end = Math.min((last + 1) * this.blockSize, this.size);
    const p = (async () => {
      const buf = new Uint8Array(end - start);
      const n = await this.inner.pread(buf, start);
      if (n !== buf.length) fail("truncated", `cache fill short read: wanted ${buf.length} bytes, got ${n}`, { file: this.name, offset: start });
      this.stats.fetches++;
      this.stats.fetchedBytes += n;
      for (let i = first; i <= last; i++) this.insert(i, buf.slice((i - first) * this.blockSize, Math.min((i - first + 1) * this.blockSize, buf.length)));
    })();
    const tracked = p.finally(() => {
      for (let i = first; i <= last; i++) if (this.inflight.get(i) === tracked) this.inflight.delete(i);
    });
    for (let i = first; i <= last; i++) this.inflight.set(i, tracked);
    return tracked;
  }

  async pread(buf: Uint8Array, offset: number): Promise<number> {
    const end = Math.min(offset + buf.length, this.size);
    if (offset >= end) return 0;
    const bs = this.blockSize;
    const b0 = Math.floor(offset / bs), b1 = Math.floor((end - 1) / bs);
    // blocks larger than the cache cannot all stay resident; read such requests straight through
    if ((b1 - b0 + 1) * bs > this.capacityBytes) return this.inner.pread(buf.subarray(0, end - offset), offset);
    const waits: Promise<void>[] = [];
    let runStart = -1;
    for (let i = b0; i <= b1 + 1; i++) {
      const missing = i <= b1 && !this.blocks.has(i) && !this.inflight.has(i);
      if (i <= b1) {
        if (this.blocks.has(i)) this.stats.hits++;
        else {
          this.stats.misses++;
          const f = this.inflight.get(i);
          if (f) waits.push(f);
        }
      }
      if (missing && runStart < 0) runStart = i;
      if (!missing && runStart >= 0) {
        waits.push(this.fetchRun(runStart, i - 1));
        runStart = -1;
      }
    }
    if (waits.length) await Promise.all(waits);
    for (let i = b0; i <= b1; i++) {
      let blk = this.blocks.get(i);
      if (!blk) {
        // evicted between fill and copy (tiny caches): fetch this one again
        await this.fetchRun(i, i);
        blk = this.blocks.get(i) ?? fail("cache_thrash", `block ${i} evicted before use`, { file: this.name, offset: i * bs });
      }
      const from = Math.max(offset, i * bs), to = Math.min(end, (i + 1) * bs);
      buf.set(blk.subarray(from - i * bs, to - i * bs), from - offset);
    }
    return end - offset;
  }

  /** Drop cached blocks overlapping [offset, offset+length) so the next read refetches them. */
  evict(offset: number, length: number): void {
    const bs = this.blockSize;
    for (let i = Math.floor(offset / bs); i * bs < offset + length; i++) this.blocks.delete(i);
    this.stats.cachedBytes = this.blocks.weight;
  }

  async close(): Promise<void> {
    this.blocks.clear();
    await this.inner.close();
  }
}
