/**
 * The writable LSMT layer: a data file (header + appended data) and an index file (header + a
 * log of 16-byte entries in write order), overlaybd-format.md 2.8. Writes append data, then log
 * the entry; `sync` fsyncs data before index. On open the log is replayed; a torn tail (partial
 * entry, or an entry pointing past the data file's end after a crash) is dropped, so a crash loses
 * at most the writes since the last sync.
 */
import { LocalFile } from "./backend.ts";
import { fail } from "./errors.ts";
import { logger } from "../../observability/log.ts";
import {
  decodeHeaderTrailer, decodeSegment, encodeHeaderTrailer, encodeSegments, ENTRY_SIZE, type HeaderTrailer, HT_SIZE, HTFlag,
  INVALID_OFFSET, MAX_ENTRY_SECTORS, MAX_RW_INDEX_ENTRIES, randomUuid, SECTOR, type Segment,
} from "./format.ts";
import { insertSegment, removeRange } from "./segments.ts";
import { dataExtents, punchHole } from "../../ffi/file_extents.ts";
import { errorMessage } from "../../util/error.ts";

const log = logger("overlaybd");
/** Largest data piece one index entry gets on write (sectors; overlaybd cuts at 4 MiB). */
const MAX_WRITE_SECTORS = 8192;

/** Options for `RwLayer.create`. */
export interface RwCreateOptions {
  /** Virtual size in bytes (multiple of 512; 0 = take the lower stack's). */
  virtualSize: number;
  /** UUID of this layer; random when absent. */
  uuid?: string;
  /** UUID of the layer below; null UUID when absent. */
  parentUuid?: string;
  /**
   * Sparse layout (`overlaybd-create -s`, header flags 0x13): virtual byte X lives at data-file
   * byte 4096+X, the index is derived from the file's holes, the index file stays empty.
   * Discard punches a hole, so a discarded range falls through to the layers below (as in
   * overlaybd). Default false.
   */
  sparse?: boolean;
}

/** An open writable layer (data + index file pair). */
export class RwLayer {
  /** Sorted, non-overlapping live mappings (sectors); tag 0. */
  readonly segments: Segment[];
  /** Sparse layout (see RwCreateOptions.sparse). */
  readonly sparse: boolean;
  private dataEnd: number; // bytes, sector aligned
  private indexEnd: number; // bytes
  private closed = false;

  private constructor(readonly data: LocalFile, readonly index: LocalFile, readonly header: HeaderTrailer, segs: Segment[], dataEnd: number, indexEnd: number) {
    this.sparse = (header.flags & HTFlag.SPARSE) !== 0;
    this.segments = segs;
    this.dataEnd = dataEnd;
    this.indexEnd = indexEnd;
  }

  /** Virtual size in bytes as recorded in the data header. */
  get virtualSize(): number {
    return this.header.virtualSize;
  }

  /** Bytes appended to the data file so far (including the 4 KiB header and garbage). */
  get dataSize(): number {
    return this.dataEnd;
  }

  /**
   * Create a new, empty pair. Both files must not exist.
   * @throws OverlaybdError `bad_size`, `open_failed`
   */
  static async create(dataPath: string, indexPath: string, opts: RwCreateOptions): Promise<RwLayer> {
    if (!Number.isSafeInteger(opts.virtualSize) || opts.virtualSize < 0 || opts.virtualSize % SECTOR !== 0) {
      fail("bad_size", `virtual size ${opts.virtualSize} is not a non-negative multiple of 512`, { file: dataPath, virtualSize: opts.virtualSize });
    }
    if (opts.sparse && opts.virtualSize === 0) fail("bad_size", "a sparse writable layer needs its virtual size up front", { file: dataPath, virtualSize: 0 });
    const uuid = opts.uuid ?? randomUuid();
    const base = { virtualSize: opts.virtualSize, uuid, parentUuid: opts.parentUuid };
    const dataFlags = HTFlag.HEADER | HTFlag.DATA | (opts.sparse ? HTFlag.SPARSE : 0);
    const data = LocalFile.open(dataPath, { writable: true, create: true });
    let index: LocalFile;
    try {
      index = LocalFile.open(indexPath, { writable: true, create: true });
    } catch (e) {
      await data.close();
      throw e;
    }
    data.pwriteSync(encodeHeaderTrailer({ ...base, flags: dataFlags }), 0);
    if (opts.sparse) data.truncateSync(HT_SIZE + opts.virtualSize);
    index.pwriteSync(encodeHeaderTrailer({ ...base, flags: HTFlag.HEADER, indexOffset: HT_SIZE }), 0);
    data.syncSync();
    index.syncSync();
    const header = decodeHeaderTrailer(encodeHeaderTrailer({ ...base, flags: dataFlags }), dataPath, 0);
    return new RwLayer(data, index, header, [], HT_SIZE, HT_SIZE);
  }

  /**
   * Open an existing pair and replay its index log.
   * @throws OverlaybdError `truncated`, `bad_magic`, `bad_flags`, `bad_index`
   */
  static async open(dataPath: string, indexPath: string, opts: { readOnly?: boolean } = {}): Promise<RwLayer> {
    const data = LocalFile.open(dataPath, { writable: !opts.readOnly });
    const index = LocalFile.open(indexPath, { writable: !opts.readOnly });
    try {
      for (const f of [data, index]) if (f.size < HT_SIZE) fail("truncated", `writable layer file of ${f.size} bytes has no 4096-byte header`, { file: f.name, offset: f.size });
      const hb = new Uint8Array(HT_SIZE);
      data.preadSync(hb, 0);
      const header = decodeHeaderTrailer(hb, dataPath, 0);
      if (!(header.flags & HTFlag.HEADER) || !(header.flags & HTFlag.DATA) || header.flags & HTFlag.SEALED) {
        fail("bad_flags", `writable data header flags 0x${header.flags.toString(16)} are not header|data`, { file: dataPath, offset: 0, flags: header.flags });
      }
      if (header.flags & HTFlag.SPARSE) {
        const segs: Segment[] = [];
        const end = HT_SIZE + header.virtualSize;
        for (const [a0, b0] of dataExtents(data.fd, Math.min(data.size, end))) {
          const a = Math.max(HT_SIZE, Math.floor(a0 / SECTOR) * SECTOR), b = Math.min(end, Math.ceil(b0 / SECTOR) * SECTOR);
          for (let s = a / SECTOR; s < b / SECTOR; s += MAX_ENTRY_SECTORS) {
            const n = Math.min(MAX_ENTRY_SECTORS, b / SECTOR - s);
            segs.push({ offset: s - HT_SIZE / SECTOR, length: n, moffset: s, zeroed: false, tag: 0 });
          }
        }
        return new RwLayer(data, index, header, segs, end, HT_SIZE);
      }
      index.preadSync(hb, 0);
      const ih = decodeHeaderTrailer(hb, indexPath, 0);
      if (!(ih.flags & HTFlag.HEADER) || ih.flags & (HTFlag.DATA | HTFlag.SEALED)) {
        fail("bad_flags", `writable index header flags 0x${ih.flags.toString(16)} are not header|index`, { file: indexPath, offset: 0, flags: ih.flags });
      }
      if (ih.indexOffset !== HT_SIZE) fail("bad_index", `writable index header says index_offset ${ih.indexOffset}, expected 4096`, { file: indexPath, offset: 32 });
      const dataEnd = Math.floor(data.size / SECTOR) * SECTOR;
      const limit = dataEnd / SECTOR;
      const count = Math.floor((index.size - HT_SIZE) / ENTRY_SIZE);
      if (count > MAX_RW_INDEX_ENTRIES) fail("bad_index", `index log holds ${count} entries (max ${MAX_RW_INDEX_ENTRIES})`, { file: indexPath, offset: HT_SIZE });
      const raw = new Uint8Array(count * ENTRY_SIZE);
      index.preadSync(raw, HT_SIZE);
      const dv = new DataView(raw.buffer);
      const segs: Segment[] = [];
      let used = count;
      for (let i = 0; i < count; i++) {
        const s = decodeSegment(dv, i);
        if (s.offset === INVALID_OFFSET) continue;
        const end = s.zeroed ? s.moffset : s.moffset + s.length;
        if (s.length === 0 || s.moffset < HT_SIZE / SECTOR || end > limit) {
          // a torn tail: data never reached the disk; everything from here on is unsynced
          log.warn({ file: indexPath, offset: HT_SIZE + i * ENTRY_SIZE, entry: i, kept: i }, "dropping index log tail past the data end");
          used = i;
          break;
        }
        s.tag = 0;
        insertSegment(segs, s);
      }
      const indexEnd = HT_SIZE + used * ENTRY_SIZE;
      // later appends must not leave stale log entries behind them
      if (!opts.readOnly && index.size !== indexEnd) index.truncateSync(indexEnd);
      return new RwLayer(data, index, header, segs, dataEnd, indexEnd);
    } catch (e) {
      await data.close();
      await index.close();
      throw e;
    }
  }

  /** Read stored bytes at `fileOffset` of the data file (bytes). */
  readData(buf: Uint8Array, fileOffset: number): number {
    return this.data.preadSync(buf, fileOffset);
  }

  /** Read `length` stored bytes at `fileOffset` into `buf` at `bufOffset`. */
  readDataAt(buf: Uint8Array, bufOffset: number, length: number, fileOffset: number): number {
    return this.data.preadSyncAt(buf, bufOffset, length, fileOffset);
  }

  private log(entries: Segment[]): void {
    const bytes = encodeSegments(entries);
    this.index.pwriteSync(bytes, this.indexEnd);
    this.indexEnd += bytes.length;
    for (const s of entries) insertSegment(this.segments, s);
  }

  /**
   * Append `buf` (length a multiple of 512) as the new content of virtual bytes [offset, offset+len).
   * @throws OverlaybdError `unaligned` when offset or length is not a multiple of 512
   */
  writeAligned(buf: Uint8Array, offset: number): void {
    if (offset % SECTOR !== 0 || buf.length % SECTOR !== 0) fail("unaligned", `write of ${buf.length} bytes at ${offset} is not 512-aligned`, { file: this.data.name, offset, length: buf.length });
    if (this.sparse) {
      this.data.pwriteSync(buf, HT_SIZE + offset);
      for (let p = 0; p < buf.length; p += MAX_ENTRY_SECTORS * SECTOR) {
        const n = Math.min(MAX_ENTRY_SECTORS * SECTOR, buf.length - p);
        insertSegment(this.segments, { offset: (offset + p) / SECTOR, length: n / SECTOR, moffset: (HT_SIZE + offset + p) / SECTOR, zeroed: false, tag: 0 });
      }
      return;
    }
    const entries: Segment[] = [];
    for (let p = 0; p < buf.length; p += MAX_WRITE_SECTORS * SECTOR) {
      const piece = buf.subarray(p, Math.min(buf.length, p + MAX_WRITE_SECTORS * SECTOR));
      this.data.pwriteSync(piece, this.dataEnd);
      entries.push({ offset: (offset + p) / SECTOR, length: piece.length / SECTOR, moffset: this.dataEnd / SECTOR, zeroed: false, tag: 0 });
      this.dataEnd += piece.length;
    }
    this.log(entries);
  }

  /**
   * Mark [offset, offset+length) (bytes, 512-aligned) as zeros with zeroed entries.
   * @throws OverlaybdError `unaligned`
   */
  discardAligned(offset: number, length: number): void {
    if (offset % SECTOR !== 0 || length % SECTOR !== 0) fail("unaligned", `discard of ${length} bytes at ${offset} is not 512-aligned`, { file: this.data.name, offset, length });
    if (this.sparse) {
      if (length === 0) return;
      try {
        punchHole(this.data.fd, HT_SIZE + offset, length);
      } catch (e) {
        fail("discard_failed", `cannot punch a hole: ${errorMessage(e)}`, { file: this.data.name, offset: HT_SIZE + offset, length });
      }
      removeRange(this.segments, offset / SECTOR, (offset + length) / SECTOR);
      return;
    }
    const entries: Segment[] = [];
    for (let s = offset / SECTOR, left = length / SECTOR; left > 0;) {
      const n = Math.min(left, MAX_ENTRY_SECTORS);
      entries.push({ offset: s, length: n, moffset: this.dataEnd / SECTOR, zeroed: true, tag: 0 });
      s += n;
      left -= n;
    }
    if (entries.length > 0) this.log(entries);
  }

  /**
   * Seal in place (overlaybd-commit --seal, close_seal): append the sorted index to the data
   * file, padded to 512 bytes, then a trailer (flags 0x06, index_offset = old end, index_size =
   * real count, uuid/parent from the header, no tag). The data file becomes a read-only layer;
   * this object is closed afterwards.
   * @returns the byte offset of the appended index
   */
  async seal(): Promise<number> {
    if (this.closed) fail("closed", "seal of a closed writable layer", { file: this.data.name });
    if (this.sparse) fail("unsupported", "a sparse writable layer cannot be sealed in place; commit it instead", { file: this.data.name, offset: 0 });
    const indexOffset = this.dataEnd;
    const idx = encodeSegments(this.segments.map((s) => ({ ...s, tag: 0 })));
    const padded = new Uint8Array(Math.ceil(idx.length / SECTOR) * SECTOR);
    padded.set(idx);
    this.data.pwriteSync(padded, indexOffset);
    const h = this.header;
    this.data.pwriteSync(encodeHeaderTrailer({ flags: HTFlag.DATA | HTFlag.SEALED, indexOffset, indexSize: this.segments.length, virtualSize: h.virtualSize, uuid: h.uuid, parentUuid: h.parentUuid }), indexOffset + padded.length);
    this.data.syncSync();
    this.index.syncSync();
    await this.close();
    return indexOffset;
  }

  /**
   * Grow the virtual size to `newSize` bytes: the size field of both files' headers is rewritten
   * (data first, each synced; the data header is the one `open` reads), a sparse data file is
   * extended. Written data stays as it is; the new range reads from the layers below, or as zeros.
   * @throws OverlaybdError `bad_size` (not a multiple of 512, or below the current size), `closed`
   */
  grow(newSize: number): void {
    if (this.closed) fail("closed", "grow of a closed writable layer", { file: this.data.name });
    if (!Number.isSafeInteger(newSize) || newSize % SECTOR !== 0 || newSize < this.header.virtualSize) {
      fail("bad_size", `cannot grow to ${newSize} bytes: not a multiple of 512, or below the current ${this.header.virtualSize}`, { file: this.data.name, virtualSize: newSize, current: this.header.virtualSize });
    }
    if (newSize === this.header.virtualSize) return;
    if (this.sparse) {
      this.data.truncateSync(HT_SIZE + newSize);
      this.dataEnd = HT_SIZE + newSize;
    }
    const hb = new Uint8Array(HT_SIZE);
    for (const f of [this.data, this.index]) {
      f.preadSync(hb, 0);
      f.pwriteSync(encodeHeaderTrailer({ ...decodeHeaderTrailer(hb, f.name, 0), virtualSize: newSize }), 0);
      f.syncSync();
    }
    this.header.virtualSize = newSize;
  }

  /** fsync data, then index: after this returns, every completed write survives a crash. */
  sync(): void {
    this.data.syncSync();
    this.index.syncSync();
  }

  /** Close both files (no implicit sync). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.data.close();
    await this.index.close();
  }
}
