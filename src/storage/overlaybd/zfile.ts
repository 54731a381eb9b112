/**
 * ZFile: a file compressed in fixed-size blocks with a jump table (overlaybd-format.md 3;
 * containerd/overlaybd src/overlaybd/zfile/zfile.cpp). `ZFileReader` is a Backend over the
 * original bytes, verifying each block's CRC32C when the file says so; `writeZFile` produces the
 * format as `overlaybd-commit -z` does (header, blocks+CRC, jump table, trailer, header rewrite).
 */
import { AtomicOutput, type Backend, readExact } from "./backend.ts";
import { rawCrc32c, ZFILE_BLOCK_CRC_SEED } from "./crc32c.ts";
import { fail } from "./errors.ts";
import { lz4Bound, lz4Compress, lz4Decompress, lz4Table } from "./lz4.ts";
import { tarPrefix, tarSuffixLength } from "./tar.ts";
import { errorMessage } from "../../util/error.ts";

/** Size of the ZFile header and trailer (bytes). */
export const ZF_HT_SIZE = 512;
/** Value of the struct size field. */
const ZF_STRUCT_SIZE = 96;
// CompressionFile::HeaderTrailer field offsets (zfile.cpp; not packed, 96 bytes)
const Z_SIZE = 24, Z_DIGEST = 28, Z_FLAGS = 32, Z_INDEX_OFFSET = 40, Z_INDEX_SIZE = 48, Z_RAW_SIZE = 56;
const Z_INDEX_CRC = 64, Z_BLOCK_SIZE = 72, Z_ALGO = 76, Z_LEVEL = 77, Z_DICT_SIZE = 84, Z_VERIFY = 88;

/** `ZFile\0\1\0` then `tuji.yyf@Alibaba`. */
export const ZFILE_MAGIC0 = new TextEncoder().encode("ZFile\0\x01\0");
export const ZFILE_MAGIC1 = new TextEncoder().encode("tuji.yyf@Alibaba");

/** Flag bits (uint64 at 32; only the low bits are meaningful). */
export const ZFlag = { HEADER: 1, DATA: 2, SEALED: 4, OVERWRITE: 8, DIGEST: 16 } as const;

/** Compression algorithm codes stored at byte 76. */
export const ZAlgo = { lz4: 1, zstd: 2 } as const;
/** Name of an algorithm. */
export type ZAlgoName = keyof typeof ZAlgo;

/** Largest jump-table size a reader accepts (blocks). */
const MAX_BLOCKS = 1_000_000_000;
/** Block sizes the tools allow (bytes). */
export const ZFILE_BLOCK_SIZES = [4096, 8192, 16384, 32768, 65536];

/** Decoded ZFile header or trailer (sizes in bytes; `indexSize` in blocks). */
export interface ZFileHeader {
  flags: number;
  digest: number;
  indexOffset: number;
  indexSize: number;
  rawSize: number;
  indexCrc: number;
  blockSize: number;
  algo: number;
  level: number;
  dictSize: number;
  verify: boolean;
}

function u64(dv: DataView, off: number): number {
  return dv.getUint32(off, true) + dv.getUint32(off + 4, true) * 2 ** 32;
}
function setU64(dv: DataView, off: number, v: number): void {
  dv.setUint32(off, v % 2 ** 32, true);
  dv.setUint32(off + 4, Math.floor(v / 2 ** 32), true);
}

/** True when `b` starts with both ZFile magics. */
export function hasZFileMagic(b: Uint8Array): boolean {
  if (b.length < 24) return false;
  for (let i = 0; i < 8; i++) if (b[i] !== ZFILE_MAGIC0[i]) return false;
  for (let i = 0; i < 16; i++) if (b[8 + i] !== ZFILE_MAGIC1[i]) return false;
  return true;
}

/** Decode a 512-byte ZFile header/trailer (magic checked; nothing else). */
export function decodeZHeader(b: Uint8Array, file: string, offset: number): ZFileHeader {
  if (!hasZFileMagic(b)) fail("bad_magic", "not a ZFile header/trailer (magic mismatch)", { file, offset });
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  return {
    flags: dv.getUint32(Z_FLAGS, true), // high word holds junk in old files; only low bits are used
    digest: dv.getUint32(Z_DIGEST, true),
    indexOffset: u64(dv, Z_INDEX_OFFSET),
    indexSize: u64(dv, Z_INDEX_SIZE),
    rawSize: u64(dv, Z_RAW_SIZE),
    indexCrc: dv.getUint32(Z_INDEX_CRC, true),
    blockSize: dv.getUint32(Z_BLOCK_SIZE, true),
    algo: b[Z_ALGO]!,
    level: b[Z_LEVEL]!,
    dictSize: dv.getUint32(Z_DICT_SIZE, true),
    verify: b[Z_VERIFY] === 1,
  };
}

/** Encode a header/trailer into 512 bytes, computing the digest when the DIGEST flag is set. */
export function encodeZHeader(h: Omit<ZFileHeader, "digest">): Uint8Array {
  const b = new Uint8Array(ZF_HT_SIZE);
  const dv = new DataView(b.buffer);
  b.set(ZFILE_MAGIC0, 0);
  b.set(ZFILE_MAGIC1, 8);
  dv.setUint32(Z_SIZE, ZF_STRUCT_SIZE, true);
  setU64(dv, Z_FLAGS, h.flags);
  setU64(dv, Z_INDEX_OFFSET, h.indexOffset);
  setU64(dv, Z_INDEX_SIZE, h.indexSize);
  setU64(dv, Z_RAW_SIZE, h.rawSize);
  dv.setUint32(Z_INDEX_CRC, h.indexCrc, true);
  dv.setUint32(Z_BLOCK_SIZE, h.blockSize, true);
  b[Z_ALGO] = h.algo;
  b[Z_LEVEL] = h.level;
  dv.setUint32(Z_DICT_SIZE, h.dictSize, true);
  b[Z_VERIFY] = h.verify ? 1 : 0;
  if (h.flags & ZFlag.DIGEST) dv.setUint32(Z_DIGEST, rawCrc32c(b, 0), true);
  return b;
}

/** CRC (seed 0) of a 512-byte header with its digest field read as zero. */
function headerDigest(b: Uint8Array): number {
  const c = b.slice(0, ZF_HT_SIZE);
  new DataView(c.buffer).setUint32(Z_DIGEST, 0, true);
  return rawCrc32c(c, 0);
}

/** True when the first 512 bytes of `b` are a ZFile header (magic and header bit). */
export async function isZFile(b: Backend): Promise<boolean> {
  if (b.size < 2 * ZF_HT_SIZE) return false;
  const h = new Uint8Array(ZF_HT_SIZE);
  await readExact(b, h, 0);
  return hasZFileMagic(h) && (new DataView(h.buffer).getUint32(Z_FLAGS, true) & ZFlag.HEADER) !== 0;
}

/**
 * Random-access reader over a ZFile. Reads past `size` return short; every block is CRC-checked
 * when the file's verify byte is 1.
 */
export class ZFileReader implements Backend {
  readonly name: string;
  readonly size: number;
  readonly header: ZFileHeader;
  /** Where the fields came from: the overwritten header or the trailer. */
  readonly source: "header" | "trailer";
  /** starts[i] is the byte offset of block i; starts[n] the end of the last block. */
  private readonly starts: Float64Array;
  private readonly bs: number;
  private readonly crcLen: number;
  private readonly blockBuf: Uint8Array;
  private cachedBlock = -1;
  preadSync?: (buf: Uint8Array, offset: number) => number;

  private constructor(readonly inner: Backend, h: ZFileHeader, source: "header" | "trailer", starts: Float64Array) {
    this.name = inner.name;
    this.header = h;
    this.source = source;
    this.size = h.rawSize;
    this.starts = starts;
    this.bs = h.blockSize;
    this.crcLen = h.verify ? 4 : 0;
    this.blockBuf = new Uint8Array(h.blockSize);
    if (inner.preadSync) {
      const sync = inner.preadSync.bind(inner);
      this.preadSync = (buf, offset) => this.readWith(buf, offset, (b, o) => {
        const n = sync(b, o);
        if (n !== b.length) fail("truncated", `ZFile data short read: wanted ${b.length} bytes, got ${n}`, { file: this.name, offset: o });
      });
    }
  }

  /**
   * Open a ZFile on `inner`, following zfile.cpp load_jump_table: header magic and bit0, digest if
   * flagged, fields from the header when bit3 (overwrite) is set, else from the trailer.
   * @throws OverlaybdError `bad_magic`, `bad_flags`, `digest_mismatch`, `bad_jump_table`, `truncated`, `bad_header`
   */
  static async open(inner: Backend): Promise<ZFileReader> {
    const file = inner.name;
    if (inner.size < 2 * ZF_HT_SIZE) fail("truncated", `ZFile of ${inner.size} bytes is shorter than header + trailer`, { file, offset: 0 });
    const hb = new Uint8Array(ZF_HT_SIZE);
    await readExact(inner, hb, 0);
    let h = decodeZHeader(hb, file, 0);
    if (!(h.flags & ZFlag.HEADER)) fail("bad_flags", "ZFile header lacks the header flag", { file, offset: 0, flags: h.flags });
    if (h.flags & ZFlag.DIGEST && headerDigest(hb) !== h.digest) {
      fail("digest_mismatch", `ZFile header digest mismatch (stored 0x${h.digest.toString(16)}, computed 0x${headerDigest(hb).toString(16)})`, { file, offset: 0 });
    }
    let source: "header" | "trailer" = "header";
    const trailerOffset = inner.size - ZF_HT_SIZE;
    if (!(h.flags & ZFlag.OVERWRITE)) {
      if (!(h.flags & ZFlag.DATA)) fail("bad_flags", "ZFile header is neither overwritten nor a data file", { file, offset: 0, flags: h.flags });
      const tb = new Uint8Array(ZF_HT_SIZE);
      await readExact(inner, tb, trailerOffset);
      h = decodeZHeader(tb, file, trailerOffset);
      const f = h.flags;
      if (f & ZFlag.HEADER || !(f & ZFlag.DATA) || !(f & ZFlag.SEALED)) fail("bad_flags", "ZFile trailer flags are not trailer|data|sealed", { file, offset: trailerOffset, flags: f });
      source = "trailer";
    }
    if (h.algo !== ZAlgo.lz4 && h.algo !== ZAlgo.zstd) fail("bad_header", `unsupported ZFile algorithm ${h.algo}`, { file, offset: 76, algo: h.algo });
    if (h.blockSize < 512 || h.blockSize > 1 << 20 || h.blockSize % 512 !== 0) fail("bad_header", `bad ZFile block size ${h.blockSize}`, { file, offset: 72 });
    if (h.indexSize > MAX_BLOCKS || h.indexOffset < ZF_HT_SIZE || h.indexOffset + h.indexSize * 4 > trailerOffset) {
      fail("bad_jump_table", `jump table of ${h.indexSize} entries at ${h.indexOffset} does not fit before the trailer at ${trailerOffset}`, { file, offset: h.indexOffset, indexSize: h.indexSize });
    }
    if (h.indexSize !== Math.ceil(h.rawSize / h.blockSize)) {
      fail("bad_jump_table", `jump table has ${h.indexSize} blocks but the original size ${h.rawSize} needs ${Math.ceil(h.rawSize / h.blockSize)}`, { file, offset: h.indexOffset });
    }
    const jt = new Uint8Array(h.indexSize * 4);
    await readExact(inner, jt, h.indexOffset);
    if (h.flags & ZFlag.DIGEST) {
      const c = rawCrc32c(jt, 0);
      if (c !== h.indexCrc) fail("crc_mismatch", `ZFile jump table CRC mismatch (stored 0x${h.indexCrc.toString(16)}, computed 0x${c.toString(16)})`, { file, offset: h.indexOffset });
    }
    const dv = new DataView(jt.buffer);
    const starts = new Float64Array(h.indexSize + 1);
    starts[0] = ZF_HT_SIZE + h.dictSize;
    const minLen = h.verify ? 4 : 0;
    for (let i = 0; i < h.indexSize; i++) {
      const len = dv.getUint32(i * 4, true);
      if (len <= minLen || len > h.blockSize * 2 + 1024) fail("bad_jump_table", `ZFile block ${i} has stored length ${len}`, { file, offset: h.indexOffset + i * 4, block: i });
      starts[i + 1] = starts[i]! + len;
    }
    if (starts[h.indexSize]! > h.indexOffset) fail("bad_jump_table", `ZFile blocks end at ${starts[h.indexSize]} past the jump table at ${h.indexOffset}`, { file, offset: h.indexOffset });
    return new ZFileReader(inner, h, source, starts);
  }

  /** Check every block's CRC and that it decompresses; returns the number of blocks checked. */
  async verifyAll(): Promise<number> {
    const buf = new Uint8Array(1 << 20);
    for (let off = 0; off < this.size; off += buf.length) await this.pread(buf, off);
    return this.header.indexSize;
  }

  /** Decode block `i` from its stored bytes `comp` (data + CRC) into `out`; returns raw length. */
  private decodeBlock(i: number, comp: Uint8Array, out: Uint8Array): number {
    const dataLen = comp.length - this.crcLen;
    const data = comp.subarray(0, dataLen);
    const blockOff = this.starts[i]!;
    if (this.crcLen) {
      const stored = (comp[dataLen]! | (comp[dataLen + 1]! << 8) | (comp[dataLen + 2]! << 16) | (comp[dataLen + 3]! << 24)) >>> 0;
      const c = rawCrc32c(data, ZFILE_BLOCK_CRC_SEED);
      if (c !== stored) fail("crc_mismatch", `ZFile block ${i} CRC mismatch (stored 0x${stored.toString(16)}, computed 0x${c.toString(16)})`, { file: this.name, offset: blockOff, block: i });
    }
    const want = Math.min(this.bs, this.size - i * this.bs);
    let n: number;
    try {
      if (this.header.algo === ZAlgo.lz4) n = lz4Decompress(data, out.subarray(0, want));
      else {
        const d = Bun.zstdDecompressSync(data);
        if (d.length > want) fail("decompress_failed", `zstd block ${i} inflates to ${d.length} bytes, more than ${want}`, { file: this.name, offset: blockOff, block: i });
        out.set(d);
        n = d.length;
      }
    } catch (e) {
      if ((e as { code?: string }).code === "overlaybd.decompress_failed") throw e;
      fail("decompress_failed", `ZFile block ${i} does not decompress: ${errorMessage(e)}`, { file: this.name, offset: blockOff, block: i });
    }
    if (n !== want) fail("decompress_failed", `ZFile block ${i} inflates to ${n} bytes, expected ${want}`, { file: this.name, offset: blockOff, block: i });
    return n;
  }

  /**
   * Shared read loop; `fetch` fills a buffer with stored bytes (sync here, awaited by `pread`).
   * Compressed reads are batched up to 1 MiB.
   */
  private readWith(buf: Uint8Array, offset: number, fetch: (b: Uint8Array, o: number) => void): number {
    const end = Math.min(offset + buf.length, this.size);
    if (offset >= end) return 0;
    const bs = this.bs;
    let blk = Math.floor(offset / bs);
    const lastBlk = Math.floor((end - 1) / bs);
    let pos = offset;
    while (blk <= lastBlk) {
      // one batch of consecutive blocks
      let upto = blk;
      while (upto < lastBlk && this.starts[upto + 2]! - this.starts[blk]! <= 1 << 20) upto++;
      const cs = this.starts[blk]!, ce = this.starts[upto + 1]!;
      let comp: Uint8Array | null = null;
      for (let i = blk; i <= upto; i++) {
        const bStart = i * bs, bEnd = Math.min(bStart + bs, this.size);
        const from = Math.max(pos, bStart), to = Math.min(end, bEnd);
        let raw: Uint8Array;
        if (i === this.cachedBlock) raw = this.blockBuf;
        else {
          if (!comp) {
            comp = new Uint8Array(ce - cs);
            fetch(comp, cs);
          }
          const whole = from === bStart && to === bEnd;
          // blockBuf is about to change: forget what it held until the decode succeeds
          if (!whole) this.cachedBlock = -1;
          const target = whole ? buf.subarray(from - offset, to - offset) : this.blockBuf;
          this.decodeBlock(i, comp.subarray(this.starts[i]! - cs, this.starts[i + 1]! - cs), target);
          if (whole) {
            pos = to;
            continue;
          }
          this.cachedBlock = i;
          raw = this.blockBuf;
        }
        buf.set(raw.subarray(from - bStart, to - bStart), from - offset);
        pos = to;
      }
      blk = upto + 1;
    }
    return end - offset;
  }

  async pread(buf: Uint8Array, offset: number): Promise<number> {
    if (this.preadSync) return this.preadSync(buf, offset);
    // async inner: fetch stored bytes first, then decode synchronously
    const end = Math.min(offset + buf.length, this.size);
    if (offset >= end) return 0;
    const b0 = Math.floor(offset / this.bs), b1 = Math.floor((end - 1) / this.bs);
    const cs = this.starts[b0]!, ce = this.starts[b1 + 1]!;
    const stored = new Uint8Array(ce - cs);
    // a bad block from a cache may be a bad fetch: drop it and refetch, up to 3 times (zfile.cpp)
    const evict = (this.inner as { evict?: (o: number, l: number) => void }).evict;
    for (let attempt = 1; ; attempt++) {
      await readExact(this.inner, stored, cs);
      try {
        return this.readWith(buf, offset, (b, o) => b.set(stored.subarray(o - cs, o - cs + b.length)));
      } catch (e) {
        const code = (e as { code?: string }).code;
        if (!evict || attempt > 3 || (code !== "overlaybd.crc_mismatch" && code !== "overlaybd.decompress_failed")) throw e;
        evict.call(this.inner, cs, ce - cs);
      }
    }
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

/** Options of `writeZFile`. */
export interface ZFileWriteOptions {
  /** Compression algorithm; default zstd (level 3). */
  algo?: ZAlgoName;
  /** Block size in bytes, one of ZFILE_BLOCK_SIZES; default 4096. */
  blockSize?: number;
  /** Rewrite the header with the final index fields (as overlaybd-commit -z does); default true. */
  overwriteHeader?: boolean;
  /** Wrap the result in overlaybd's tar wrapper; default false. */
  tar?: boolean;
}

/**
 * Compress all of `src` into a new ZFile at `outPath` (which must not exist; the file appears
 * there only once complete).
 * @returns the stored size of the output in bytes
 * @throws OverlaybdError `overlaybd.bad_option` for an unsupported block size or algorithm
 */
export async function writeZFile(src: Backend, outPath: string, opts: ZFileWriteOptions = {}): Promise<number> {
  const algoName = opts.algo ?? "zstd";
  const algo = ZAlgo[algoName];
  if (!algo) fail("bad_option", `unknown compression algorithm ${JSON.stringify(algoName)}`, { algo: algoName });
  const bs = opts.blockSize ?? 4096;
  if (!ZFILE_BLOCK_SIZES.includes(bs)) fail("bad_option", `block size ${bs} is not one of ${ZFILE_BLOCK_SIZES.join(", ")}`, { blockSize: bs });
  const overwrite = opts.overwriteHeader ?? true;
  const base = opts.tar ? 1536 : 0;
  const target = new AtomicOutput(outPath);
  const out = target.file;
  try {
    const rawSize = src.size;
    const nBlocks = Math.ceil(rawSize / bs);
    const common = { indexOffset: 0, indexSize: 0, rawSize: 0, indexCrc: 0, blockSize: bs, algo, level: 0, dictSize: 0, verify: true };
    out.pwriteSync(encodeZHeader({ ...common, flags: ZFlag.HEADER | ZFlag.DATA | ZFlag.DIGEST }), base);
    let wpos = base + ZF_HT_SIZE;
    const jt = new Uint8Array(nBlocks * 4);
    const jdv = new DataView(jt.buffer);
    const chunk = 256 * bs;
    const inBuf = new Uint8Array(chunk);
    const outBuf = new Uint8Array(256 * (lz4Bound(bs) + 4) + 64 * 1024);
    const cbuf = new Uint8Array(lz4Bound(bs));
    const table = lz4Table();
    for (let off = 0, blk = 0; off < rawSize; off += chunk) {
      const len = Math.min(chunk, rawSize - off);
      await readExact(src, inBuf.subarray(0, len), off);
      let op = 0;
      for (let p = 0; p < len; p += bs, blk++) {
        const raw = inBuf.subarray(p, Math.min(p + bs, len));
        let c: Uint8Array;
        if (algo === ZAlgo.lz4) c = cbuf.subarray(0, lz4Compress(raw, cbuf, table));
        else c = Bun.zstdCompressSync(raw, { level: 3 });
        if (op + c.length + 4 > outBuf.length) {
          out.pwriteSync(outBuf.subarray(0, op), wpos);
          wpos += op;
          op = 0;
        }
        outBuf.set(c, op);
        new DataView(outBuf.buffer).setUint32(op + c.length, rawCrc32c(c, ZFILE_BLOCK_CRC_SEED), true);
        op += c.length + 4;
        jdv.setUint32(blk * 4, c.length + 4, true);
      }
      out.pwriteSync(outBuf.subarray(0, op), wpos);
      wpos += op;
    }
    const indexOffset = wpos - base;
    out.pwriteSync(jt, wpos);
    wpos += jt.length;
    const fin = { ...common, indexOffset, indexSize: nBlocks, rawSize, indexCrc: rawCrc32c(jt, 0) };
    out.pwriteSync(encodeZHeader({ ...fin, flags: ZFlag.DATA | ZFlag.SEALED | ZFlag.DIGEST }), wpos);
    wpos += ZF_HT_SIZE;
    if (overwrite) out.pwriteSync(encodeZHeader({ ...fin, flags: ZFlag.HEADER | ZFlag.DATA | ZFlag.OVERWRITE | ZFlag.DIGEST }), base);
    const payload = wpos - base;
    if (opts.tar) {
      out.pwriteSync(tarPrefix(payload), 0);
      out.pwriteSync(new Uint8Array(tarSuffixLength(payload)), wpos);
      wpos += tarSuffixLength(payload);
    }
    target.publish();
    return wpos;
  } catch (e) {
    target.abort();
    throw e;
  }
}
