/**
 * Memory images kept served after their last VM (`[snapshot] warm_images`): the snapshots
 * creates start from (template and user snapshots) and the boot snapshots, so that the next
 * restore finds the image's pages in the page cache instead of reading them through the export
 * again. An image is let go once its snapshot is deleted or replaced (tombstoned).
 */
import type { Logger } from "pino";
import type { LocalRepository, SharedImages, SnapshotManifest } from "../snapshot/index.ts";
import { layerPaths, memoryKey } from "./capture.ts";

/** Kinds of snapshot whose memory image is kept warm after restores: what creates start from. */
export const WARM_KINDS: readonly SnapshotManifest["kind"][] = ["template", "user"];

/** The warm holds on memory images, by image key. */
export class WarmImages {
  /** Memory image key -> the snapshot it was kept warm for (SharedImages.keepWarm). */
  readonly #warmFor = new Map<string, string>();

  constructor(
    private readonly repo: LocalRepository,
    private readonly images: SharedImages,
    private readonly log: Logger,
  ) {}

  /**
   * Keep the memory image of `base` (a snapshot with memory just restored from) open after its
   * last sandbox, and let go of images whose snapshot is gone. Never throws: a failure only costs
   * the next restore its warm page cache.
   */
  async keep(base: SnapshotManifest): Promise<void> {
    this.coolStale();
    const key = memoryKey(base);
    try {
      if (await this.images.keepWarm(key, layerPaths(this.repo, base.memory!.layers))) this.#warmFor.set(key, base.id);
    } catch (e) {
      this.log.warn({ snapshot: base.id, err: e }, "memory image not kept warm");
    }
    for (const k of [...this.#warmFor.keys()]) if (!this.images.warmKeys().includes(k)) this.#warmFor.delete(k);
  }

  /** Release the warm hold on memory images whose snapshot was deleted or replaced (tombstoned). */
  coolStale(): void {
    for (const [key, id] of [...this.#warmFor]) {
      let gone = true;
      try {
        gone = this.repo.find(id) === undefined || this.repo.isTombstoned(id);
      } catch (e) {
        this.log.warn({ snapshot: id, err: e }, "unreadable manifest: its memory image is not kept warm");
      }
      if (!gone) continue;
      this.#warmFor.delete(key);
      this.images.cool(key);
    }
  }
}
