/**
 * The direct-read plan of an overlaybd stack for the FUSE export's reader threads: which
 * virtual ranges live in plain local layer files (read there by pread without the main thread)
 * and which must go through the image (the upper's mapped segments, and pieces of layers that
 * are not plain local files, e.g. ZFile-compressed or remote).
 * Mapping rules: overlaybd-format.md 2.7 as implemented by `LayeredImage` (offsets, lengths and
 * moffsets in 512-byte sectors; zeroed segments and unmapped ranges read as zeros).
 */
import type { DirectPlan } from "../fuse/index.ts";
import { LayeredImage, LocalFile, SECTOR } from "../overlaybd/index.ts";

/**
 * Build the plan of `img`, or null when it offers nothing to read directly (no layer is a plain
 * local file). The fds in the plan belong to the image: valid until `img.close()`.
 */
export function layeredDirectPlan(img: LayeredImage): DirectPlan | null {
  const extents: DirectPlan["extents"] = [];
  const diverted: Array<[number, number]> = [];
  for (const s of img.roIndex) {
    if (s.zeroed) continue;
    const b = img.lowers[s.tag]!.lsmt;
    const range: [number, number] = [s.offset * SECTOR, (s.offset + s.length) * SECTOR];
    if (b instanceof LocalFile) extents.push({ offset: range[0], length: range[1] - range[0], fd: b.fd, fileOffset: s.moffset * SECTOR });
    else diverted.push(range);
  }
  if (extents.length === 0) return null;
  for (const s of img.writable?.segments ?? []) diverted.push([s.offset * SECTOR, (s.offset + s.length) * SECTOR]);
  return { extents, zeroFill: true, diverted };
}
