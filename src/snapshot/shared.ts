/**
 * Shared read-only images: one export per memory stack, mapped by every VM restored from it
 * (copy-on-write in each VMM), so the host page cache holds the image once. Refcounted: the
 * first user opens the export, the last one's release closes it. The export mechanism (the disk
 * daemon's shared device: a FUSE file, or a read-only ublk device) is behind `ImageExporter`.
 *
 * Warm images (`keepWarm`): the table itself may hold one lease on up to `warmMax` images, the
 * most recently kept first, so an image stays open (and the page cache keeps what restores
 * fault in through it) after its last VM stopped; the next restore from it finds its working set
 * cached instead of reading it through the export again. Past the bound the least recently kept
 * one is released; `cool` releases one (its snapshot went away).
 */
import { logger } from "../observability/log.ts";
import { SnapshotError } from "./errors.ts";
import { LruMap } from "../util/lru.ts";

const log = logger("snapshot.shared");

/** A served read-only image: a file (or device) path a VMM can open and map. */
export interface ServedImage {
  path: string;
  /** Resolves when serving stopped for good. */
  exited: Promise<unknown>;
  /** The exporter's counters of the image (reads, bytes, opens), when it keeps any. */
  stats?(): Promise<{ reads: number; bytes_read: number; opens: number; image_opens: number }>;
  /** Stop serving. Only after every VMM mapping it has exited. */
  close(): Promise<void>;
}

/** Serves a stack of read-only layer files (bottom first) as one image. */
export interface ImageExporter {
  /**
   * @param key short stable name of the image (used in paths and process names)
   * @param layers absolute layer paths, bottom first
   */
  open(key: string, layers: string[]): Promise<ServedImage>;
}

/** A user's hold on a shared image. `release()` is idempotent. */
export interface ImageLease {
  key: string;
  path: string;
  release(): Promise<void>;
}

interface Entry {
  refs: number;
  opening: Promise<ServedImage>;
  served?: ServedImage;
  closing?: Promise<void>;
}

/** Per-key counters, for tests and benchmarks. */
export interface SharedImageStats {
  /** Times the export was opened (1 while it stays open for several users). */
  opens: number;
  /** Current users. */
  refs: number;
}

/** Settings of a `SharedImages` table. */
export interface SharedImagesOptions {
  /** Images the table keeps open after their last user (`[snapshot] warm_images`); 0 = none. */
  warmMax: number;
}

/** The table of shared images of one node. */
export class SharedImages {
  private readonly entries = new Map<string, Entry>();
  private readonly opens = new Map<string, number>();
  /** The table's own leases (keepWarm), least recently kept first; past `warmMax` the oldest is released. */
  private readonly warm: LruMap<string, ImageLease>;
  /** Releases of cooled images in progress (closeAll waits for them). */
  private readonly cooling = new Set<Promise<void>>();

  constructor(
    private readonly exporter: ImageExporter,
    private readonly opts: SharedImagesOptions = { warmMax: 0 },
  ) {
    this.warm = new LruMap(Math.max(0, opts.warmMax), { onEvict: (_key, lease) => this.background(lease.release()) });
  }

  /**
   * Keep image `key` (made of `layers`) open after its last user: the table takes a lease on it
   * (opening it if nobody holds it) or, holding one, marks it the most recently kept. Past
   * `warmMax` the least recently kept image's lease is released in the background.
   * @returns whether the table holds a lease on `key` now (false with `warmMax` 0)
   * @throws whatever the exporter throws when it had to open the image
   */
  async keepWarm(key: string, layers: string[]): Promise<boolean> {
    if (this.opts.warmMax <= 0) return false;
    if (!this.warm.get(key)) {
      const lease = await this.acquire(key, layers);
      // a concurrent keepWarm of the same key may have won meanwhile: one lease per key
      if (this.warm.get(key)) this.background(lease.release());
      else this.warm.set(key, lease);
    }
    return true;
  }

  /** Release the table's own lease on `key`, if it holds one (the image closes once no VM maps it). */
  cool(key: string): void {
    const l = this.warm.peek(key);
    if (!l) return;
    this.warm.delete(key);
    this.background(l.release());
  }

  /** Keys the table keeps warm, least recently kept first. */
  warmKeys(): string[] {
    return [...this.warm.keys()];
  }

  /** Resolves once the releases `cool` and `keepWarm` started in the background are done. */
  async settled(): Promise<void> {
    await Promise.all([...this.cooling]);
  }

  private background(p: Promise<void>): void {
    const t = p.catch((err) => log.error({ err }, "releasing a warm shared image failed")).finally(() => this.cooling.delete(t));
    this.cooling.add(t);
  }

  /**
   * Take a hold on the image `key` made of `layers`, opening it when nobody holds it.
   * @param already the image as it is served already, used instead of opening it when nobody
   *   holds it (a node taking over the image a previous node served for the VMs it adopts)
   * @throws whatever the exporter throws (the hold is not taken)
   */
  async acquire(key: string, layers: string[], already?: ServedImage): Promise<ImageLease> {
    let e = this.entries.get(key);
    if (e?.closing) {
      await e.closing;
      e = this.entries.get(key);
    }
    if (!e) {
      const entry: Entry = { refs: 0, opening: already ? Promise.resolve(already) : this.exporter.open(key, layers) };
      this.entries.set(key, entry);
      this.opens.set(key, (this.opens.get(key) ?? 0) + 1);
      entry.opening.then(
        (s) => {
          entry.served = s;
          void s.exited.then(() => {
            if (this.entries.get(key) === entry && !entry.closing) log.error({ key, refs: entry.refs }, "shared image export ended while in use");
          });
        },
        () => {
          if (this.entries.get(key) === entry) this.entries.delete(key);
        },
      );
      e = entry;
    }
    e.refs++;
    let served: ServedImage;
    try {
      served = await e.opening;
    } catch (err) {
      e.refs--;
      throw err;
    }
    let released = false;
    const entry = e;
    return {
      key,
      path: served.path,
      release: async () => {
        if (released) return;
        released = true;
        entry.refs--;
        if (entry.refs < 0) throw new SnapshotError("snapshot.in_use", `shared image ${key}: reference count went negative`, { key });
        if (entry.refs > 0 || entry.closing) return;
        entry.closing = (async () => {
          try {
            await served.close();
          } finally {
            if (this.entries.get(key) === entry) this.entries.delete(key);
          }
        })();
        await entry.closing;
      },
    };
  }

  /** Counters of `key` (zeros when never opened). */
  stats(key: string): SharedImageStats {
    return { opens: this.opens.get(key) ?? 0, refs: this.entries.get(key)?.refs ?? 0 };
  }

  /** The serving process of `key` while open. */
  servedBy(key: string): ServedImage | undefined {
    return this.entries.get(key)?.served;
  }

  /** Keys currently open. */
  keys(): string[] {
    return [...this.entries.keys()];
  }

  /** Close every export regardless of holders (node shutdown, after the VMs stopped). */
  async closeAll(): Promise<void> {
    this.warm.clear();
    await this.settled();
    for (const [key, e] of [...this.entries]) {
      this.entries.delete(key);
      const s = await e.opening.catch(() => undefined);
      await s?.close().catch((err) => log.error({ key, err }, "closing shared image failed"));
    }
  }
}
