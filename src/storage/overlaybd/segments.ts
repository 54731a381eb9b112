/**
 * Operations on sorted segment arrays (the in-memory LSMT index): binary search, overwrite
 * insertion, top-down stack merge, neighbour compaction and the load-time validation rules of
 * overlaybd-format.md 2.6-2.9. All offsets and lengths are in 512-byte sectors.
 */
import { fail } from "./errors.ts";
import { MAX_ENTRY_SECTORS, type Segment } from "./format.ts";

/** Index of the first segment whose end lies after `sector`, or `segs.length`. O(log n). */
export function firstEndingAfter(segs: readonly Segment[], sector: number): number {
  let lo = 0, hi = segs.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const s = segs[mid]!;
    if (s.offset + s.length <= sector) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * The segments overlapping [offset, offset+length), trimmed to it (moffset adjusted for data
 * segments). Allocates; meant for tests, tools and commit, not the read path.
 */
export function lookup(segs: readonly Segment[], offset: number, length: number): Segment[] {
  const end = offset + length, out: Segment[] = [];
  for (let i = firstEndingAfter(segs, offset); i < segs.length; i++) {
    const s = segs[i]!;
    if (s.offset >= end) break;
    out.push(trim(s, Math.max(s.offset, offset), Math.min(s.offset + s.length, end)));
  }
  return out;
}

/** A copy of `s` cut to virtual sectors [from, to) (which must lie inside it). */
export function trim(s: Segment, from: number, to: number): Segment {
  return { offset: from, length: to - from, moffset: s.zeroed ? s.moffset : s.moffset + (from - s.offset), zeroed: s.zeroed, tag: s.tag };
}

/**
 * Insert `n` into the sorted, non-overlapping `segs` in place; `n` wins over what it covers
 * (older segments are trimmed or split), as overlaybd's RW index does on pwrite/discard.
 */
export function insertSegment(segs: Segment[], n: Segment): void {
  if (n.length <= 0) return;
  const end = n.offset + n.length;
  const i = firstEndingAfter(segs, n.offset);
  let j = i;
  while (j < segs.length && segs[j]!.offset < end) j++;
  const repl: Segment[] = [];
  if (j > i) {
    const first = segs[i]!, last = segs[j - 1]!;
    if (first.offset < n.offset) repl.push(trim(first, first.offset, n.offset));
    repl.push(n);
    if (last.offset + last.length > end) repl.push(trim(last, end, last.offset + last.length));
  } else repl.push(n);
  segs.splice(i, j - i, ...repl);
}

/**
 * Overlay `upper` on `lower` (both sorted, non-overlapping): every upper segment, plus the parts
 * of lower segments that fall into upper's gaps. Zeroed upper segments stay and hide lower data.
 */
export function overlay(upper: readonly Segment[], lower: readonly Segment[]): Segment[] {
  const out: Segment[] = [];
  let j = 0;
  let cursor = 0; // sectors below `cursor` are decided
  const fillGap = (gapEnd: number) => {
    while (j < lower.length && lower[j]!.offset + lower[j]!.length <= cursor) j++;
    let k = j;
    while (k < lower.length && lower[k]!.offset < gapEnd) {
      const l = lower[k]!;
      const a = Math.max(l.offset, cursor), b = Math.min(l.offset + l.length, gapEnd);
      if (a < b) out.push(a === l.offset && b === l.offset + l.length ? l : trim(l, a, b));
      if (l.offset + l.length > gapEnd) break;
      k++;
    }
    j = k;
  };
  for (const u of upper) {
    fillGap(u.offset);
    out.push(u);
    cursor = u.offset + u.length;
  }
  fillGap(Number.MAX_SAFE_INTEGER);
  return out;
}

/**
 * Validate a loaded read-only index (overlaybd index.cpp create_memory_index): strictly ordered,
 * data segments inside [8, limitSector], zeroed moffsets inside [8, limitSector].
 * @throws OverlaybdError `overlaybd.bad_index` naming the file, entry number and byte offset of the entry.
 */
export function validateRoIndex(segs: readonly Segment[], limitSector: number, file: string, indexOffset: number): void {
  let prevEnd = -1;
  for (let i = 0; i < segs.length; i++) {
    const s = segs[i]!;
    const offset = indexOffset + i * 16;
    if (s.offset < prevEnd) fail("bad_index", `index entry ${i} overlaps or is out of order (sector ${s.offset} < previous end ${prevEnd})`, { file, offset, entry: i });
    if (s.length === 0) fail("bad_index", `index entry ${i} has length 0`, { file, offset, entry: i });
    if (s.moffset < 8) fail("bad_index", `index entry ${i} points into the header (moffset ${s.moffset})`, { file, offset, entry: i });
    const dataEnd = s.zeroed ? s.moffset : s.moffset + s.length;
    if (dataEnd > limitSector) fail("bad_index", `index entry ${i} points past the data (sector ${dataEnd} > ${limitSector})`, { file, offset, entry: i, moffset: s.moffset, limit: limitSector });
    prevEnd = s.offset + s.length;
  }
}

/**
 * Merge neighbours the way overlaybd's compaction does: j joins the previous kept i when they
 * touch virtually and physically, share the zeroed bit and tag, and i.length + j.length < 16383.
 * Returns a new array; inputs are not changed.
 */
export function mergeNeighbours(segs: readonly Segment[]): Segment[] {
  const out: Segment[] = [];
  for (const s of segs) {
    const p = out[out.length - 1];
    if (p && p.offset + p.length === s.offset && (p.zeroed ? p.moffset : p.moffset + p.length) === s.moffset &&
        p.zeroed === s.zeroed && p.tag === s.tag && p.length + s.length < MAX_ENTRY_SECTORS) {
      p.length += s.length;
    } else out.push({ ...s });
  }
  return out;
}

/** Remove every mapping of sectors [from, to) from the sorted `segs` in place (trimming or splitting). */
export function removeRange(segs: Segment[], from: number, to: number): void {
  if (to <= from) return;
  const i = firstEndingAfter(segs, from);
  let j = i;
  while (j < segs.length && segs[j]!.offset < to) j++;
  if (j === i) return;
  const first = segs[i]!, last = segs[j - 1]!;
  const keep: Segment[] = [];
  if (first.offset < from) keep.push(trim(first, first.offset, from));
  if (last.offset + last.length > to) keep.push(trim(last, to, last.offset + last.length));
  segs.splice(i, j - i, ...keep);
}
