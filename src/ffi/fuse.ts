/**
 * FUSE kernel protocol on /dev/fuse, byte layouts for x86_64 (little-endian).
 * Source: include/uapi/linux/fuse.h (protocol 7.38 header, fields up to 7.45 from the 7.43 uapi),
 * offsets as verified in ../shared/docs/fuse-nbd.md §1.2–§1.5.
 * Pure encode/decode: the server in src/storage/fuse/ owns the session.
 */

/** fuse_in_header (40 bytes). */
export const IN_HEADER_SIZE = 40;
/** fuse_out_header (16 bytes). */
export const OUT_HEADER_SIZE = 16;
/** The device refuses reads into buffers smaller than this (FUSE_MIN_READ_BUFFER). */
export const MIN_READ_BUFFER = 8192;
/** Node id of the root directory. */
export const ROOT_ID = 1n;
/** Protocol version we speak. */
export const KERNEL_MAJOR = 7;
export const KERNEL_MINOR = 45;

/** Opcodes (enum fuse_opcode). */
export const Op = {
  LOOKUP: 1, FORGET: 2, GETATTR: 3, SETATTR: 4, OPEN: 14, READ: 15, WRITE: 16, STATFS: 17, RELEASE: 18,
  FSYNC: 20, GETXATTR: 22, FLUSH: 25, INIT: 26, OPENDIR: 27, READDIR: 28, RELEASEDIR: 29, FSYNCDIR: 30,
  ACCESS: 34, CREATE: 35, INTERRUPT: 36, DESTROY: 38, BATCH_FORGET: 42, FALLOCATE: 43, LSEEK: 46,
} as const;

/** INIT flags (low word). */
export const InitFlag = {
  ASYNC_READ: 1 << 0, BIG_WRITES: 1 << 5, ASYNC_DIO: 1 << 15, PARALLEL_DIROPS: 1 << 18,
  ABORT_ERROR: 1 << 21, MAX_PAGES: 1 << 22, INIT_EXT: 1 << 30,
} as const;
/** INIT flags2 bits (high word): FUSE_REQUEST_TIMEOUT is bit 42 → flags2 bit 10. */
export const InitFlag2 = { REQUEST_TIMEOUT: 1 << 10 } as const;

/** fuse_open_out.open_flags. */
export const FOPEN_DIRECT_IO = 0x1;
export const FOPEN_KEEP_CACHE = 0x2;
/** fuse_setattr_in.valid bit for a size change. */
export const FATTR_SIZE = 0x8;
/** fallocate(2) modes (linux/falloc.h). */
export const FALLOC_FL_KEEP_SIZE = 0x1;
export const FALLOC_FL_PUNCH_HOLE = 0x2;
export const FALLOC_FL_ZERO_RANGE = 0x10;
/** Access mode bits of open(2) flags. */
export const O_ACCMODE = 3;
export const O_RDONLY = 0;

/** errno values sent as negative `error` in replies. */
export const Errno = {
  EPERM: 1, ENOENT: 2, EIO: 5, EBADF: 9, EACCES: 13, EEXIST: 17, ENOTDIR: 20, EISDIR: 21, EINVAL: 22,
  ENOSPC: 28, EROFS: 30, ENOSYS: 38, EPROTO: 71, EOPNOTSUPP: 95,
} as const;

/** File type bits (sys/stat.h). */
export const S_IFDIR = 0o040000;
export const S_IFREG = 0o100000;
/** d_type values for READDIR (DT_DIR, DT_REG). */
export const DT_DIR = 4;
export const DT_REG = 8;

/** Decoded fuse_in_header. */
export interface InHeader {
  len: number;
  opcode: number;
  unique: bigint;
  nodeid: bigint;
  uid: number;
  gid: number;
  pid: number;
}

/** Decode the 40-byte fuse_in_header at the start of `buf`. */
export function decodeInHeader(buf: Uint8Array): InHeader {
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  return {
    len: v.getUint32(0, true),
    opcode: v.getUint32(4, true),
    unique: v.getBigUint64(8, true),
    nodeid: v.getBigUint64(16, true),
    uid: v.getUint32(24, true),
    gid: v.getUint32(28, true),
    pid: v.getUint32(32, true),
  };
}

/**
 * A complete reply: fuse_out_header + body. `error` is 0 or a positive errno (encoded negated);
 * an error reply carries no body (the kernel rejects one with EINVAL). With `separateBodyLen`
 * only the header is returned, its `len` covering a body of that many bytes written after it
 * in the same writev.
 */
export function encodeReply(unique: bigint, error: number, body?: Uint8Array, separateBodyLen = 0): Uint8Array {
  const bodyLen = error === 0 && body && !separateBodyLen ? body.byteLength : 0;
  const out = new Uint8Array(OUT_HEADER_SIZE + bodyLen);
  const v = new DataView(out.buffer);
  v.setUint32(0, out.byteLength + (error === 0 ? separateBodyLen : 0), true);
  v.setInt32(4, error === 0 ? 0 : -error, true);
  v.setBigUint64(8, unique, true);
  if (bodyLen) out.set(body!, OUT_HEADER_SIZE);
  return out;
}

/** enum fuse_notify_code: ask the kernel to re-send requests read but not answered (7.40). */
export const NOTIFY_RESEND = 7;

/** enum fuse_notify_code: drop cached attributes (and pages) of an inode (7.12). */
export const NOTIFY_INVAL_INODE = 2;

/**
 * Body of FUSE_NOTIFY_INVAL_INODE (struct fuse_notify_inval_inode_out, 24 bytes): nodeid, then
 * the byte range of cached pages to drop (`offset` < 0: attributes only; `length` 0: to the end).
 */
export function encodeInvalInode(nodeid: bigint, offset: number, length: number): Uint8Array {
  const b = new Uint8Array(24);
  const v = new DataView(b.buffer);
  v.setBigUint64(0, nodeid, true);
  v.setBigInt64(8, BigInt(offset), true);
  v.setBigInt64(16, BigInt(length), true);
  return b;
}

/**
 * A notification from server to kernel: out header with unique 0 and the positive notify code
 * in `error`, followed by the notification's body (RESEND has none).
 */
export function encodeNotify(code: number, body: Uint8Array = new Uint8Array(0)): Uint8Array {
  const out = new Uint8Array(OUT_HEADER_SIZE + body.byteLength);
  const v = new DataView(out.buffer);
  v.setUint32(0, out.byteLength, true);
  v.setInt32(4, code, true);
  v.setBigUint64(8, 0n, true);
  out.set(body, OUT_HEADER_SIZE);
  return out;
}

/** fuse_init_in (64 bytes; we read the first 20). */
export interface InitIn {
  major: number;
  minor: number;
  maxReadahead: number;
  flags: number;
  flags2: number;
}

/** Decode fuse_init_in from a request body. */
export function decodeInitIn(body: Uint8Array): InitIn {
  const v = new DataView(body.buffer, body.byteOffset, body.byteLength);
  return {
    major: v.getUint32(0, true),
    minor: v.getUint32(4, true),
    maxReadahead: v.getUint32(8, true),
    flags: v.getUint32(12, true),
    flags2: body.byteLength >= 20 ? v.getUint32(16, true) : 0,
  };
}

/** Values of our fuse_init_out. */
export interface InitOut {
  major: number;
  minor: number;
  maxReadahead: number;
  flags: number;
  flags2: number;
  maxBackground: number;
  congestionThreshold: number;
  /** bytes */
  maxWrite: number;
  /** pages of 4 KiB */
  maxPages: number;
  /** seconds, 0 = none (7.43) */
  requestTimeout: number;
}

/** Encode fuse_init_out (64 bytes). */
export function encodeInitOut(o: InitOut): Uint8Array {
  const out = new Uint8Array(64);
  const v = new DataView(out.buffer);
  v.setUint32(0, o.major, true);
  v.setUint32(4, o.minor, true);
  v.setUint32(8, o.maxReadahead, true);
  v.setUint32(12, o.flags >>> 0, true);
  v.setUint16(16, o.maxBackground, true);
  v.setUint16(18, o.congestionThreshold, true);
  v.setUint32(20, o.maxWrite, true);
  v.setUint32(24, 1, true); // time_gran: 1 ns
  v.setUint16(28, o.maxPages, true);
  v.setUint16(30, 0, true); // map_alignment
  v.setUint32(32, o.flags2 >>> 0, true);
  v.setUint32(36, 0, true); // max_stack_depth
  v.setUint16(40, o.requestTimeout, true);
  return out;
}

/** Inode attributes (fuse_attr); times in seconds since the epoch. */
export interface Attr {
  ino: bigint;
  /** bytes */
  size: number;
  mode: number;
  nlink: number;
  uid: number;
  gid: number;
  /** seconds */
  time: number;
}

/** fuse_attr is 88 bytes. */
export const ATTR_SIZE = 88;

function writeAttr(v: DataView, at: number, a: Attr): void {
  v.setBigUint64(at + 0, a.ino, true);
  v.setBigUint64(at + 8, BigInt(a.size), true);
  v.setBigUint64(at + 16, BigInt(Math.ceil(a.size / 512)), true); // blocks of 512 bytes
  v.setBigUint64(at + 24, BigInt(a.time), true); // atime
  v.setBigUint64(at + 32, BigInt(a.time), true); // mtime
  v.setBigUint64(at + 40, BigInt(a.time), true); // ctime
  v.setUint32(at + 60, a.mode, true);
  v.setUint32(at + 64, a.nlink, true);
  v.setUint32(at + 68, a.uid, true);
  v.setUint32(at + 72, a.gid, true);
  v.setUint32(at + 80, 4096, true); // blksize
}

/** fuse_attr_out (104 bytes): attr_valid seconds, then fuse_attr at 16. */
export function encodeAttrOut(a: Attr, validSec: number): Uint8Array {
  const out = new Uint8Array(16 + ATTR_SIZE);
  const v = new DataView(out.buffer);
  v.setBigUint64(0, BigInt(validSec), true);
  writeAttr(v, 16, a);
  return out;
}

/** fuse_entry_out (128 bytes): nodeid, generation, entry/attr validity, fuse_attr at 40. */
export function encodeEntryOut(a: Attr, validSec: number): Uint8Array {
  const out = new Uint8Array(40 + ATTR_SIZE);
  const v = new DataView(out.buffer);
  v.setBigUint64(0, a.ino, true);
  v.setBigUint64(8, 0n, true);
  v.setBigUint64(16, BigInt(validSec), true);
  v.setBigUint64(24, BigInt(validSec), true);
  writeAttr(v, 40, a);
  return out;
}

/** fuse_open_out (16 bytes). */
export function encodeOpenOut(fh: bigint, openFlags: number): Uint8Array {
  const out = new Uint8Array(16);
  const v = new DataView(out.buffer);
  v.setBigUint64(0, fh, true);
  v.setUint32(8, openFlags, true);
  return out;
}

/** fuse_read_in / fuse_write_in share their first 24 bytes: fh, offset, size, flags. */
export interface RwIn {
  fh: bigint;
  /** bytes; the kernel sends a u64, values above 2^53 are clamped to MAX_SAFE_INTEGER */
  offset: number;
  /** bytes */
  size: number;
  flags: number;
}

/** Decode fuse_read_in or fuse_write_in (40 bytes). WRITE data follows at body offset 40. */
export function decodeRwIn(body: Uint8Array): RwIn {
  const v = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const off = v.getBigUint64(8, true);
  return {
    fh: v.getBigUint64(0, true),
    offset: off > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(off),
    size: v.getUint32(16, true),
    flags: v.getUint32(20, true),
  };
}
/** Size of fuse_write_in; the data starts after it. */
export const WRITE_IN_SIZE = 40;

/** fuse_write_out (8 bytes). */
export function encodeWriteOut(size: number): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setUint32(0, size, true);
  return out;
}

/** fuse_open_in.flags (open(2) flags). */
export function decodeOpenFlags(body: Uint8Array): number {
  return new DataView(body.buffer, body.byteOffset, body.byteLength).getUint32(0, true);
}

/** fuse_setattr_in (88 bytes): valid @0, size @16. */
export function decodeSetattrIn(body: Uint8Array): { valid: number; size: number } {
  const v = new DataView(body.buffer, body.byteOffset, body.byteLength);
  return { valid: v.getUint32(0, true), size: Number(v.getBigUint64(16, true)) };
}

/** fuse_fallocate_in (32 bytes): fh @0, offset @8, length @16, mode @24. */
export function decodeFallocateIn(body: Uint8Array): { fh: bigint; offset: number; length: number; mode: number } {
  const v = new DataView(body.buffer, body.byteOffset, body.byteLength);
  return {
    fh: v.getBigUint64(0, true),
    offset: Number(v.getBigUint64(8, true)),
    length: Number(v.getBigUint64(16, true)),
    mode: v.getUint32(24, true),
  };
}

/** fuse_kstatfs (80 bytes); counts in blocks of `bsize` bytes. */
export function encodeStatfsOut(blocks: number, bsize: number, files: number): Uint8Array {
  const out = new Uint8Array(80);
  const v = new DataView(out.buffer);
  v.setBigUint64(0, BigInt(blocks), true);
  v.setBigUint64(8, 0n, true);
  v.setBigUint64(16, 0n, true);
  v.setBigUint64(24, BigInt(files), true);
  v.setBigUint64(32, 0n, true);
  v.setUint32(40, bsize, true);
  v.setUint32(44, 255, true); // namelen
  v.setUint32(48, bsize, true); // frsize
  return out;
}

/** One directory entry for READDIR. */
export interface Dirent {
  ino: bigint;
  name: string;
  type: number;
}

/**
 * Pack fuse_dirent records (24-byte header + name, padded to 8) starting at cookie `from`,
 * stopping before `maxBytes` would be exceeded. `off` of each record = cookie of the next entry.
 */
export function encodeDirents(entries: Dirent[], from: number, maxBytes: number): Uint8Array {
  const parts: Uint8Array[] = [];
  let total = 0;
  for (let i = from; i < entries.length; i++) {
    const e = entries[i]!;
    const name = Buffer.from(e.name, "utf8");
    const recLen = (24 + name.byteLength + 7) & ~7;
    if (total + recLen > maxBytes) break;
    const rec = new Uint8Array(recLen);
    const v = new DataView(rec.buffer);
    v.setBigUint64(0, e.ino, true);
    v.setBigUint64(8, BigInt(i + 1), true);
    v.setUint32(16, name.byteLength, true);
    v.setUint32(20, e.type, true);
    rec.set(name, 24);
    parts.push(rec);
    total += recLen;
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}

/** The NUL-terminated name of a LOOKUP body. */
export function decodeName(body: Uint8Array): string {
  const nul = body.indexOf(0);
  return Buffer.from(body.subarray(0, nul < 0 ? body.byteLength : nul)).toString("utf8");
}
