/**
 * Shared read-only images: one export per memory stack, mapped by every VM restored from it
 * (copy-on-write in each VMM), so the host page cache holds the image once. Refcounted: the
 * first user opens the export, the last one's release closes it. The export mechanism (the disk
 * daemon's shared device: a FUSE file, or a read-only ublk device) is behind `ImageExporter`.
 */
import { logger } from "../observability/log.ts";
import { SnapshotError } from "./errors.ts";

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

/** The table of shared images of one node. */
export class SharedImages {
  private readonly entries = new Map<string, Entry>();
  private readonly opens = new Map<string, number>();

  constructor(private readonly exporter: ImageExporter) {}

  /**
   * Take a hold on the image `key` made of `layers`, opening it when nobody holds it.
   * @throws whatever the exporter throws (the hold is not taken)
   */
  async acquire(key: string, layers: string[]): Promise<ImageLease> {
    let e = this.entries.get(key);
    if (e?.closing) {
      await e.closing;
      e = this.entries.get(key);
    }
    if (!e) {
      const entry: Entry = { refs: 0, opening: this.exporter.open(key, layers) };
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
    for (const [key, e] of [...this.entries]) {
      this.entries.delete(key);
      const s = await e.opening.catch(() => undefined);
      await s?.close().catch((err) => log.error({ key, err }, "closing shared image failed"));
    }
  }
}
