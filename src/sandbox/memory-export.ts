/**
 * The memory-image exporter of this node: a read-only overlaybd stack of memory layers served by
 * the disk daemon as one shared device per stack, with the daemon's engine: a FUSE file with
 * KEEP_CACHE (every VM mapping it shares the host page cache) or a read-only /dev/ublkbN (one
 * block device, one page cache); O_RDWR opens accepted, writes refused. A restarted daemon
 * resumes it (FUSE: from the connection copy the node holds; ublk: user recovery), so the VMs
 * mapping the image see a pause, not SIGBUS. The image's `exited` resolves when it is closed or
 * lost (its device gone).
 */
import type { ImageExporter, ServedImage } from "../snapshot/index.ts";
import { sharedDeviceId, type DiskExport, type DiskService } from "../storage/daemon/index.ts";

/** File name of a served memory image inside its mount. */
export const MEMORY_IMAGE_FILE = "memory.img";

/** Disk daemon device id of the memory image `key` (`SharedImages` key) this exporter serves. */
export function memoryImageDevice(key: string): string {
  return sharedDeviceId(`mem-${key}`);
}

/** An exporter serving memory images through `disks` (share key `mem-<key>`). */
export function diskMemoryExporter(disks: DiskService): ImageExporter {
  return {
    async open(key: string, layers: string[]): Promise<ServedImage> {
      return servedImage(await disks.acquireShared({ key: `mem-${key}`, lowers: layers, fileName: MEMORY_IMAGE_FILE, acceptWritableOpen: true }));
    },
  };
}

/** Export `d` of a memory image as a served image (its `exited` resolves when it closes or is lost). */
export function servedImage(d: DiskExport): ServedImage {
  let closed!: () => void;
  const exited = new Promise<void>((r) => (closed = r));
  void d.lost.then(() => closed());
  return {
    path: d.path,
    exited,
    stats: () => d.stats(),
    close: async () => {
      await d.close();
      closed();
    },
  };
}
