/**
 * The memory-image exporter of this node: a read-only overlaybd stack of memory layers served by
 * the disk daemon as one shared device per stack (a FUSE file with KEEP_CACHE, so every VM
 * mapping it shares the host page cache; O_RDWR opens accepted, WRITE refused; a ublk device once
 * that engine serves shared devices). The daemon keeps the image's FUSE connection open in the
 * node too, so a restarted daemon resumes it and the VMs mapping the image see a pause, not SIGBUS.
 */
import type { ImageExporter, ServedImage } from "../snapshot/index.ts";
import type { DiskService } from "../storage/daemon/index.ts";

/** File name of a served memory image inside its mount. */
export const MEMORY_IMAGE_FILE = "memory.img";

/** An exporter serving memory images through `disks` (share key `mem-<key>`). */
export function diskMemoryExporter(disks: DiskService): ImageExporter {
  return {
    async open(key: string, layers: string[]): Promise<ServedImage> {
      const d = await disks.acquireShared({ key: `mem-${key}`, lowers: layers, fileName: MEMORY_IMAGE_FILE, acceptWritableOpen: true });
      let closed!: () => void;
      const exited = new Promise<void>((r) => (closed = r));
      return {
        path: d.path,
        exited,
        stats: () => d.stats(),
        close: async () => {
          await d.close();
          closed();
        },
      };
    },
  };
}
