/**
 * Direct plans: plain-data descriptions of where a target's bytes live in local files, handed to
 * the queue threads so they answer requests without the main thread. A plan is built on the main
 * thread from an open target (its fds stay valid until the target is closed) and is cloned into
 * each Worker (fds are shared by every thread of the process; SharedArrayBuffers are shared).
 * Byte units throughout; overlaybd mapping rules (overlaybd-format.md 2.7, as `LayeredImage`
 * implements them): zeroed segments and unmapped ranges read as zeros.
 */
import { LayeredImage, LocalFile, SECTOR } from "../overlaybd/index.ts";

/** A file a plan reads or writes: its fd and the name logs and errors give. */
export interface PlanFile {
  fd: number;
  name: string;
}

/**
 * Extents of a target in plain files: an overlaybd stack's local lower layers (writes and the
 * upper's data go through the main thread), or one raw file (identity map, written directly).
 */
export interface ExtentPlan {
  kind: "extents";
  /** Virtual size, bytes. */
  size: number;
  files: PlanFile[];
  /**
   * 4 numbers per extent: virtual offset, length, file index (into `files`), file offset.
   * Sorted, non-overlapping; neighbours contiguous in both the device and one file are merged
   * (one read serves them). Bytes outside every extent read as zeros.
   */
  extents: Float64Array;
  /** File index that WRITE and FLUSH go to at the same offset (a raw file); -1: through the main thread. */
  writeFile: number;
  /**
   * Byte ranges whose content differs from `extents` from the start (an overlaybd upper's mapped
   * segments): reads there go through the main thread, as do reads of every range later written
   * or discarded through it.
   */
  diverted: Array<[number, number]>;
}

/**
 * Chunked copy-on-write over a read-only origin (see cow.ts): the chunk state array is shared by
 * every thread serving the target.
 */
export interface CowPlan {
  kind: "cow";
  /** Virtual size, bytes (= the origin's size). */
  size: number;
  /** Copy-on-write unit, bytes (a power of two). */
  chunkBytes: number;
  origin: PlanFile;
  cow: PlanFile;
  /** Int32Array per chunk: CHUNK_ORIGIN / CHUNK_COPYING / CHUNK_COW (cow.ts). */
  state: SharedArrayBuffer;
}

/** What queue threads can serve themselves. */
export type DirectPlan = ExtentPlan | CowPlan;

/** One positioned read of a request: `length` bytes of file `file` at `fileOffset` into the request buffer at `bufOffset`. */
export interface ReadPiece {
  file: number;
  fileOffset: number;
  bufOffset: number;
  length: number;
}

/**
 * Merge sorted extents (virtual offset, length, file, file offset) that continue each other in
 * both spaces, into the 4-numbers-per-extent layout of `ExtentPlan.extents`.
 */
export function packExtents(list: ReadonlyArray<readonly [number, number, number, number]>): Float64Array {
  const out: number[] = [];
  for (const [off, len, file, foff] of list) {
    const n = out.length;
    if (n > 0 && out[n - 4]! + out[n - 3]! === off && out[n - 2] === file && out[n - 1]! + out[n - 3]! === foff) {
      out[n - 3]! += len;
      continue;
    }
    out.push(off, len, file, foff);
  }
  return Float64Array.from(out);
}

/**
 * The plan of an overlaybd stack: every lower segment stored in a plain local layer file becomes
 * an extent; segments in other layers (ZFile-compressed, tar-wrapped, remote) and the upper's
 * mapped segments are `diverted` to the main thread. Null when no layer is a plain local file.
 */
export function stackPlan(img: LayeredImage): ExtentPlan | null {
  const files: PlanFile[] = [];
  const fileOf = new Map<LocalFile, number>();
  const list: Array<[number, number, number, number]> = [];
  const diverted: Array<[number, number]> = [];
  for (const s of img.roIndex) {
    if (s.zeroed) continue;
    const b = img.lowers[s.tag]!.lsmt;
    const range: [number, number] = [s.offset * SECTOR, (s.offset + s.length) * SECTOR];
    if (!(b instanceof LocalFile)) {
      diverted.push(range);
      continue;
    }
    let f = fileOf.get(b);
    if (f === undefined) {
      f = files.push({ fd: b.fd, name: b.name }) - 1;
      fileOf.set(b, f);
    }
    list.push([range[0], range[1] - range[0], f, s.moffset * SECTOR]);
  }
  if (list.length === 0) return null;
  for (const s of img.writable?.segments ?? []) diverted.push([s.offset * SECTOR, (s.offset + s.length) * SECTOR]);
  return { kind: "extents", size: img.size, files, extents: packExtents(list), writeFile: -1, diverted };
}

/** The plan of one raw file served as is (identity map), written directly unless read-only. */
export function rawPlan(file: PlanFile, size: number, readOnly: boolean): ExtentPlan {
  return { kind: "extents", size, files: [file], extents: Float64Array.of(0, size, 0, 0), writeFile: readOnly ? -1 : 0, diverted: [] };
}

/** Index of the first extent (in 4-number units) ending after byte `at`, or the extent count. */
export function firstExtentAfter(ext: Float64Array, at: number): number {
  let lo = 0, hi = ext.length / 4;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (ext[mid * 4]! + ext[mid * 4 + 1]! <= at) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * Split the read of [offset, offset+length) into file pieces (pushed to `out`) and zero ranges
 * (passed to `zero(bufOffset, length)`), in order. The caller checks the range against the size.
 */
export function planExtentRead(p: ExtentPlan, offset: number, length: number, out: ReadPiece[], zero: (bufOffset: number, length: number) => void): void {
  const ext = p.extents;
  const end = offset + length;
  let pos = offset;
  for (let i = firstExtentAfter(ext, offset); i * 4 < ext.length && pos < end; i++) {
    const a = ext[i * 4]!, len = ext[i * 4 + 1]!;
    if (a >= end) break;
    if (a > pos) {
      zero(pos - offset, a - pos);
      pos = a;
    }
    const e = Math.min(a + len, end);
    out.push({ file: ext[i * 4 + 2]!, fileOffset: ext[i * 4 + 3]! + (pos - a), bufOffset: pos - offset, length: e - pos });
    pos = e;
  }
  if (pos < end) zero(pos - offset, end - pos);
}

/** Size of one block of the diverted-reads bitmap, bytes. */
export const DIVERT_BLOCK = 4096;

/** A bitmap (bit per DIVERT_BLOCK) over a SharedArrayBuffer, for `size` bytes. */
export function newDivertMap(size: number): Int32Array {
  return new Int32Array(new SharedArrayBuffer(4 * (Math.ceil(size / DIVERT_BLOCK / 32) + 1)));
}

/** Set the bits of every block touching [offset, offset+length). */
export function markDiverted(map: Int32Array, offset: number, length: number): void {
  if (length <= 0) return;
  const first = Math.floor(offset / DIVERT_BLOCK), last = Math.floor((offset + length - 1) / DIVERT_BLOCK);
  for (let b = first; b <= last; b++) {
    const w = b >>> 5, bit = 1 << (b & 31);
    if ((Atomics.load(map, w) & bit) === 0) Atomics.or(map, w, bit);
  }
}

/** True when a block touching [offset, offset+length) is marked. */
export function isDiverted(map: Int32Array, offset: number, length: number): boolean {
  const first = Math.floor(offset / DIVERT_BLOCK), last = Math.floor((offset + length - 1) / DIVERT_BLOCK);
  for (let b = first; b <= last; b++) if (Atomics.load(map, b >>> 5) & (1 << (b & 31))) return true;
  return false;
}
