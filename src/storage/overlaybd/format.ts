/**
 * LSMT on-disk structures: the 4096-byte HeaderTrailer and the 16-byte SegmentMapping.
 * Layouts from overlaybd-format.md 2.2-2.5 (containerd/overlaybd src/overlaybd/lsmt/file.cpp,
 * index.h). Everything is little-endian; mapping units are 512-byte sectors.
 */
import { fail } from "./errors.ts";

/** Bytes in one sector, the unit of every LSMT mapping. */
export const SECTOR = 512;
/** Size of the LSMT header and trailer blocks (bytes). */
export const HT_SIZE = 4096;
/** Value of the packed struct size field (bytes). */
export const HT_STRUCT_SIZE = 390;
/** Size of one index entry (bytes). */
export const ENTRY_SIZE = 16;
/** Longest run one entry can map (sectors). */
export const MAX_ENTRY_SECTORS = 16383;
/** Offset value marking a padding (invalid) entry. */
export const INVALID_OFFSET = 2 ** 50 - 1;
/** Committed indexes are padded to a multiple of this many entries (one 4 KiB page). */
export const INDEX_PAGE_ENTRIES = 256;
/** Readers reject RO trailers with more entries than this. */
export const MAX_RO_INDEX_ENTRIES = 1_000_000;
/** Readers reject RW index files with more entries than this. */
export const MAX_RW_INDEX_ENTRIES = 128_000_000;
/** Most layers a stack may hold. */
export const MAX_LAYERS = 255;

// HeaderTrailer field offsets, lsmt/file.cpp struct HeaderTrailer (packed)
const O_MAGIC0 = 0, O_MAGIC1 = 8, O_SIZE = 24, O_FLAGS = 28, O_INDEX_OFFSET = 32, O_INDEX_SIZE = 40;
const O_VSIZE = 48, O_UUID = 56, O_PARENT = 93, O_VERSION = 132, O_SUBVERSION = 133, O_TAG = 134;
const UUID_FIELD = 37, TAG_FIELD = 256;

/** `LSMT\0\1\2\0` */
export const LSMT_MAGIC0 = Uint8Array.of(0x4c, 0x53, 0x4d, 0x54, 0x00, 0x01, 0x02, 0x00);
/** Photon UUID d2637e65-4494-4c08-d2a2-c8ec4fcfae8a stored little-endian. */
export const LSMT_MAGIC1 = Uint8Array.of(0x65, 0x7e, 0x63, 0xd2, 0x94, 0x44, 0x08, 0x4c, 0xa2, 0xd2, 0xc8, 0xec, 0x4f, 0xcf, 0xae, 0x8a);

/** Flag bits of HeaderTrailer.flags (overlaybd-format.md 2.3). */
export const HTFlag = { HEADER: 1, DATA: 2, SEALED: 4, GC: 8, SPARSE: 16, INFO_VALID: 32 } as const;

/** The null UUID string written when none is given. */
export const NULL_UUID = "00000000-0000-0000-0000-000000000000";

/** Decoded HeaderTrailer. Sizes in bytes except `indexSize` (entries). */
export interface HeaderTrailer {
  flags: number;
  indexOffset: number;
  indexSize: number;
  virtualSize: number;
  uuid: string;
  parentUuid: string;
  version: number;
  subVersion: number;
  userTag: string;
}

function u64(dv: DataView, off: number): number {
  return dv.getUint32(off, true) + dv.getUint32(off + 4, true) * 2 ** 32;
}
function setU64(dv: DataView, off: number, v: number): void {
  dv.setUint32(off, v % 2 ** 32, true);
  dv.setUint32(off + 4, Math.floor(v / 2 ** 32), true);
}

function readCString(b: Uint8Array, off: number, len: number): string {
  let end = off;
  while (end < off + len && b[end] !== 0) end++;
  return new TextDecoder().decode(b.subarray(off, end));
}

/** True when `s` is a UUID string photon accepts: 36 hex chars with dashes at 8, 13, 18, 23. */
export function isUuid(s: string): boolean {
  return /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/.test(s);
}

/** A fresh random UUID in photon's upper-case rendering. */
export function randomUuid(): string {
  return crypto.randomUUID().toUpperCase();
}

/** True when the buffer starts with the LSMT magics. */
export function hasLsmtMagic(b: Uint8Array): boolean {
  if (b.length < 24) return false;
  for (let i = 0; i < 8; i++) if (b[i] !== LSMT_MAGIC0[i]) return false;
  for (let i = 0; i < 16; i++) if (b[8 + i] !== LSMT_MAGIC1[i]) return false;
  return true;
}

/**
 * Decode a 4096-byte (at least 390-byte) HeaderTrailer.
 * @throws OverlaybdError `overlaybd.bad_magic` naming `file` and `offset` when the magics differ.
 */
export function decodeHeaderTrailer(b: Uint8Array, file: string, offset: number): HeaderTrailer {
  if (b.length < HT_STRUCT_SIZE) fail("truncated", `LSMT header/trailer needs ${HT_STRUCT_SIZE} bytes, got ${b.length}`, { file, offset });
  if (!hasLsmtMagic(b)) fail("bad_magic", "not an LSMT header/trailer (magic mismatch)", { file, offset });
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  return {
    flags: dv.getUint32(O_FLAGS, true),
    indexOffset: u64(dv, O_INDEX_OFFSET),
    indexSize: u64(dv, O_INDEX_SIZE),
    virtualSize: u64(dv, O_VSIZE),
    uuid: readCString(b, O_UUID, UUID_FIELD),
    parentUuid: readCString(b, O_PARENT, UUID_FIELD),
    version: b[O_VERSION]!,
    subVersion: b[O_SUBVERSION]!,
    userTag: readCString(b, O_TAG, TAG_FIELD),
  };
}

/**
 * Encode a HeaderTrailer into a new zeroed 4096-byte block, byte-identical to overlaybd's writer
 * (size 390, version 1.1, null UUIDs rendered as zeros-with-dashes).
 * @throws OverlaybdError `overlaybd.bad_uuid` for a malformed uuid, `overlaybd.bad_tag` for a tag over 256 bytes.
 */
export function encodeHeaderTrailer(h: Partial<HeaderTrailer> & { flags: number }): Uint8Array {
  const b = new Uint8Array(HT_SIZE);
  const dv = new DataView(b.buffer);
  b.set(LSMT_MAGIC0, O_MAGIC0);
  b.set(LSMT_MAGIC1, O_MAGIC1);
  dv.setUint32(O_SIZE, HT_STRUCT_SIZE, true);
  dv.setUint32(O_FLAGS, h.flags, true);
  setU64(dv, O_INDEX_OFFSET, h.indexOffset ?? 0);
  setU64(dv, O_INDEX_SIZE, h.indexSize ?? 0);
  setU64(dv, O_VSIZE, h.virtualSize ?? 0);
  const enc = new TextEncoder();
  for (const [off, v] of [[O_UUID, h.uuid], [O_PARENT, h.parentUuid]] as const) {
    const s = v && v.length > 0 ? v : NULL_UUID;
    if (!isUuid(s)) fail("bad_uuid", `not a UUID: ${JSON.stringify(s)}`, { uuid: s });
    b.set(enc.encode(s.toUpperCase()), off);
  }
  b[O_VERSION] = h.version ?? 1;
  b[O_SUBVERSION] = h.subVersion ?? 1;
  const tag = enc.encode(h.userTag ?? "");
  if (tag.length > TAG_FIELD) fail("bad_tag", `user tag is ${tag.length} bytes, at most ${TAG_FIELD}`, { length: tag.length });
  b.set(tag, O_TAG);
  return b;
}

/**
 * One mapping of virtual sectors [offset, offset+length) to layer sectors at `moffset`.
 * `zeroed` runs read as zeros. `tag` selects the layer in a merged stack index.
 */
export interface Segment {
  offset: number;
  length: number;
  moffset: number;
  zeroed: boolean;
  tag: number;
}

/**
 * Decode entry `i` of a packed index (16 bytes each, overlaybd-format.md 2.5) without BigInt.
 * @throws OverlaybdError `overlaybd.bad_index` when moffset exceeds 2^53 (no real file does).
 */
export function decodeSegment(dv: DataView, i: number): Segment {
  const o = i * ENTRY_SIZE;
  const w0 = dv.getUint32(o, true), w1 = dv.getUint32(o + 4, true);
  const w2 = dv.getUint32(o + 8, true), w3 = dv.getUint32(o + 12, true);
  const hi = w3 & 0x7fffff;
  if (hi >= 0x200000) fail("bad_index", "index entry moffset exceeds 2^53 sectors", { entry: i });
  return {
    offset: w0 + (w1 & 0x3ffff) * 2 ** 32,
    length: w1 >>> 18,
    moffset: w2 + hi * 2 ** 32,
    zeroed: ((w3 >>> 23) & 1) === 1,
    tag: w3 >>> 24,
  };
}

/** Encode `s` as entry `i` of a packed index (16 bytes). */
export function encodeSegment(dv: DataView, i: number, s: Segment): void {
  const o = i * ENTRY_SIZE;
  dv.setUint32(o, s.offset % 2 ** 32, true);
  dv.setUint32(o + 4, (Math.floor(s.offset / 2 ** 32) | (s.length << 18)) >>> 0, true);
  dv.setUint32(o + 8, s.moffset % 2 ** 32, true);
  dv.setUint32(o + 12, (Math.floor(s.moffset / 2 ** 32) | (s.zeroed ? 1 << 23 : 0) | ((s.tag & 0xff) << 24)) >>> 0, true);
}

/** The padding entry: offset 2^50-1, everything else 0. */
export const INVALID_SEGMENT: Segment = { offset: INVALID_OFFSET, length: 0, moffset: 0, zeroed: false, tag: 0 };

/** Pack segments into a new byte array (16 bytes each). */
export function encodeSegments(segs: readonly Segment[], padTo = 0): Uint8Array {
  const n = Math.max(segs.length, padTo);
  const b = new Uint8Array(n * ENTRY_SIZE);
  const dv = new DataView(b.buffer);
  for (let i = 0; i < n; i++) encodeSegment(dv, i, i < segs.length ? segs[i]! : INVALID_SEGMENT);
  return b;
}
