/**
 * Importers: turn a raw disk image or a sparse file (a VM memory dump) into a committed layer.
 * All-zero 4 KiB blocks are not stored; a sparse file is read only where SEEK_DATA finds data;
 * with a parent image only blocks that differ from it are stored.
 */
import { LocalFile } from "./backend.ts";
import { CommittedLayerWriter, type CommitMeta } from "./commit.ts";
import { fail } from "./errors.ts";
import { SECTOR, type Segment } from "./format.ts";
import type { LayeredImage } from "./stack.ts";
import { dataExtents } from "../../ffi/file_extents.ts";

/** Options of the importers. */
export interface ImportOptions {
  /** An image whose content the new layer goes on top of: identical blocks are not stored,
   *  zero blocks over parent data become zeroed entries. */
  parent?: LayeredImage;
  /** Header fields; virtual size defaults to the source size rounded up to 512. */
  meta?: Partial<CommitMeta>;
  /** Comparison unit in bytes; default 4096. */
  blockSize?: number;
}

/**
 * Turn a raw disk image into a committed layer at `outPath`. All-zero 4 KiB blocks are not stored.
 * @returns the merged index and file size
 */
export async function importRaw(rawPath: string, outPath: string, opts: ImportOptions = {}): Promise<{ segments: Segment[]; size: number }> {
  const src = LocalFile.open(rawPath);
  try {
    return await importRanges(src, [[0, src.size]], outPath, opts);
  } finally {
    await src.close();
  }
}

/**
 * Turn a sparse file (memory dump, raw disk) into a committed layer at `outPath`, visiting only
 * the data extents found with SEEK_DATA/SEEK_HOLE; holes cost nothing.
 */
export async function importSparse(path: string, outPath: string, opts: ImportOptions = {}): Promise<{ segments: Segment[]; size: number }> {
  const src = LocalFile.open(path);
  try {
    return await importRanges(src, dataExtents(src.fd, src.size), outPath, opts);
  } finally {
    await src.close();
  }
}

/**
 * Turn byte ranges `extents` (sorted, non-overlapping) of the file at `path` into a committed
 * layer; everything outside them is "unchanged" (holes, or the parent's data). With `parent`,
 * only blocks inside the ranges that differ from it are stored (e.g. a VM disk read through its
 * export, restricted to the ranges its writable upper touched).
 */
export async function importExtents(path: string, extents: Array<[number, number]>, outPath: string, opts: ImportOptions = {}): Promise<{ segments: Segment[]; size: number }> {
  const src = LocalFile.open(path);
  try {
    return await importRanges(src, extents, outPath, opts, false);
  } finally {
    await src.close();
  }
}

/** `gapsAreZero`: bytes outside `extents` read as zeros (holes of a sparse file); false: they are unchanged from the parent. */
async function importRanges(src: LocalFile, extents: Array<[number, number]>, outPath: string, opts: ImportOptions, gapsAreZero = true): Promise<{ segments: Segment[]; size: number }> {
  const bs = opts.blockSize ?? 4096;
  if (bs % SECTOR !== 0 || bs <= 0 || (1 << 20) % bs !== 0) fail("bad_option", `block size ${bs} must be a multiple of 512 dividing 1 MiB`, { blockSize: bs });
  const vsize = opts.meta?.virtualSize ?? Math.ceil(src.size / SECTOR) * SECTOR;
  const parent = opts.parent;
  if (parent && parent.size < vsize) fail("bad_option", `parent image of ${parent.size} bytes is smaller than the source (${vsize})`, { file: src.name, size: parent.size });
  const w = new CommittedLayerWriter(outPath, { virtualSize: vsize, ...opts.meta });
  const chunk = new Uint8Array(1 << 20);
  const pchunk = parent ? new Uint8Array(1 << 20) : null;
  // the zero ranges where a parent has data need zeroed entries; collect zero ranges in order
  let zeroFrom = -1;
  const flushZero = (upto: number) => {
    if (zeroFrom < 0) return;
    if (parent) for (const [a, b] of parent.dataRanges(zeroFrom, upto)) w.addZeroed(a / SECTOR, (b - a) / SECTOR);
    zeroFrom = -1;
  };
  const markZero = (from: number) => {
    if (zeroFrom < 0) zeroFrom = from;
  };
  try {
    let prevEnd = 0;
    for (const [e0, e1] of extents) {
      const a = Math.floor(e0 / bs) * bs;
      const bEnd = Math.min(Math.ceil(e1 / bs) * bs, vsize);
      if (a > prevEnd) {
        if (gapsAreZero) markZero(prevEnd);
        else flushZero(prevEnd);
      }
      const start = Math.max(a, prevEnd);
      for (let off = start; off < bEnd; off += chunk.length) {
        const len = Math.min(chunk.length, bEnd - off);
        const c = chunk.subarray(0, len);
        const n = src.preadSync(c, off);
        if (n < len) c.fill(0, n);
        if (pchunk) await parent!.pread(pchunk.subarray(0, len), off);
        let runStart = -1;
        for (let p = 0; p < len; p += bs) {
          const blk = c.subarray(p, Math.min(p + bs, len));
          const zero = isZero(blk);
          const same = pchunk ? equal(blk, pchunk.subarray(p, p + blk.length)) : zero;
          const store = !same && !zero;
          if (store) {
            flushZero(off + p);
            if (runStart < 0) runStart = p;
          } else {
            if (runStart >= 0) {
              w.addData((off + runStart) / SECTOR, c.subarray(runStart, p));
              runStart = -1;
            }
            if (zero && !same) markZero(off + p);
            else flushZero(off + p);
          }
        }
        if (runStart >= 0) w.addData((off + runStart) / SECTOR, c.subarray(runStart, len));
      }
      prevEnd = Math.max(prevEnd, bEnd);
    }
    if (!gapsAreZero) flushZero(prevEnd);
    else if (prevEnd < vsize) markZero(prevEnd);
    flushZero(vsize);
  } catch (e) {
    await w.abort();
    throw e;
  }
  return w.finish();
}

/**
 * Build a committed layer at `outPath` of `virtualSize` bytes from the byte ranges `ranges`
 * (sorted, non-overlapping, multiples of 512), reading each piece with `read(buf, offset)`.
 * Unlisted ranges stay unmapped (they fall through to the layers below). Inside the listed ranges
 * an all-zero block (`blockSize`, default 4096) becomes a zeroed entry, which hides whatever a
 * lower layer holds there; every other block is stored. This is the shape of a memory diff:
 * the pages a VM changed since its memory image was taken, on top of that image.
 * @returns the merged index and file size
 * @throws OverlaybdError `bad_option` for unsorted, overlapping, unaligned or out-of-range ranges;
 *   whatever `read` throws (the partial output is removed)
 */
export async function importChangedRanges(
  read: (buf: Uint8Array, offset: number) => void | Promise<void>,
  ranges: ReadonlyArray<readonly [number, number]>,
  outPath: string,
  opts: { virtualSize: number; blockSize?: number; meta?: Partial<CommitMeta> },
): Promise<{ segments: Segment[]; size: number }> {
  const bs = opts.blockSize ?? 4096;
  if (bs % SECTOR !== 0 || bs <= 0 || (1 << 20) % bs !== 0) fail("bad_option", `block size ${bs} must be a multiple of 512 dividing 1 MiB`, { blockSize: bs });
  let prev = 0;
  for (const [a, b] of ranges) {
    if (a % SECTOR !== 0 || b % SECTOR !== 0 || a < prev || b <= a || b > opts.virtualSize) {
      fail("bad_option", `range [${a}, ${b}) is unsorted, overlapping, unaligned or past ${opts.virtualSize}`, { offset: a, length: b - a });
    }
    prev = b;
  }
  const w = new CommittedLayerWriter(outPath, { ...opts.meta, virtualSize: opts.virtualSize });
  const chunk = new Uint8Array(1 << 20);
  try {
    for (const [a, b] of ranges) {
      for (let off = a; off < b; off += chunk.length) {
        const len = Math.min(chunk.length, b - off);
        const c = chunk.subarray(0, len);
        await read(c, off);
        let run = -1; // start of a run of stored blocks within c
        let zeroRun = -1; // start of a run of zero blocks within c
        const flush = (p: number, keep: "data" | "zero" | "none") => {
          if (keep !== "data" && run >= 0) {
            w.addData((off + run) / SECTOR, c.subarray(run, p));
            run = -1;
          }
          if (keep !== "zero" && zeroRun >= 0) {
            w.addZeroed((off + zeroRun) / SECTOR, (p - zeroRun) / SECTOR);
            zeroRun = -1;
          }
        };
        for (let p = 0; p < len; p += bs) {
          if (isZero(c.subarray(p, Math.min(p + bs, len)))) {
            flush(p, "zero");
            if (zeroRun < 0) zeroRun = p;
          } else {
            flush(p, "data");
            if (run < 0) run = p;
          }
        }
        flush(len, "none");
      }
    }
  } catch (e) {
    await w.abort();
    throw e;
  }
  return w.finish();
}

function isZero(b: Uint8Array): boolean {
  const n = b.length & ~7;
  if ((b.byteOffset & 7) === 0) {
    const w = new BigUint64Array(b.buffer, b.byteOffset, n >>> 3);
    for (let i = 0; i < w.length; i++) if (w[i] !== 0n) return false;
  } else for (let i = 0; i < n; i++) if (b[i] !== 0) return false;
  for (let i = n; i < b.length; i++) if (b[i] !== 0) return false;
  return true;
}

function equal(a: Uint8Array, b: Uint8Array): boolean {
  return Buffer.compare(a, b) === 0;
}
