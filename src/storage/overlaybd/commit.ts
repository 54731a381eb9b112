/**
 * Writers of committed (compacted) LSMT layers, overlaybd-format.md 2.9: header (flags 0x07),
 * live data packed in LBA order in 32 KiB pieces counted from each source entry's start, index
 * merged with the compaction rule and padded to 256 entries, trailer (flags 0x06). Committing a
 * committed layer reproduces it byte for byte.
 */
import { AtomicOutput, type LocalFile } from "./backend.ts";
import { fail } from "./errors.ts";
import {
  encodeHeaderTrailer, encodeSegments, HT_SIZE, HTFlag, INDEX_PAGE_ENTRIES, MAX_ENTRY_SECTORS, NULL_UUID, SECTOR, type Segment,
} from "./format.ts";
import { mergeNeighbours } from "./segments.ts";

/** Compaction copies data in pieces of this many sectors (32 KiB). */
const PIECE_SECTORS = 64;
/** Output is buffered up to this many bytes before a write. */
const WRITE_BUFFER = 1 << 20;

/** Header fields of a new committed layer. */
export interface CommitMeta {
  /** Virtual size in bytes. */
  virtualSize: number;
  /** Layer UUID; the null UUID when absent (as overlaybd-commit without --uuid). */
  uuid?: string;
  /** Parent UUID; null when absent. */
  parentUuid?: string;
  /** Commit message, at most 256 bytes. */
  userTag?: string;
}

/**
 * Streams a committed layer to a new file. Call `addData`/`addZeroed` in increasing virtual
 * offset order, then `finish`. Offsets and lengths in sectors; data in bytes.
 */
export class CommittedLayerWriter {
  private readonly target: AtomicOutput;
  private readonly out: LocalFile;
  private readonly entries: Segment[] = [];
  private pos = HT_SIZE / SECTOR; // next data sector in the output
  private nextOffset = 0;
  private buf = new Uint8Array(WRITE_BUFFER);
  private bufLen = 0;
  private bufStart = HT_SIZE;
  private done = false;

  /** @throws OverlaybdError `open_failed` when `path` exists; the file appears only at `finish` */
  constructor(readonly path: string, readonly meta: CommitMeta) {
    this.target = new AtomicOutput(path);
    this.out = this.target.file;
  }

  private check(offset: number, length: number): void {
    if (this.done) fail("closed", "layer writer already finished", { file: this.path });
    if (offset < this.nextOffset) fail("bad_order", `segment at sector ${offset} is before the previous end ${this.nextOffset}`, { file: this.path, offset: offset * SECTOR });
    this.nextOffset = offset + length;
  }

  /** Record [offset, offset+length) sectors as zeroed (no data stored). */
  addZeroed(offset: number, length: number): void {
    this.check(offset, length);
    for (let s = offset, left = length; left > 0;) {
      const n = Math.min(left, MAX_ENTRY_SECTORS);
      this.entries.push({ offset: s, length: n, moffset: this.pos, zeroed: true, tag: 0 });
      s += n;
      left -= n;
    }
  }

  /**
   * Store `data` (a multiple of 512 bytes) at virtual sector `offset`. Pieces of 64 sectors are
   * counted from `pieceBase` (the source entry's start; default `offset`), as overlaybd does.
   */
  addData(offset: number, data: Uint8Array, pieceBase = offset): void {
    if (data.length % SECTOR !== 0) fail("unaligned", `data of ${data.length} bytes is not a multiple of 512`, { file: this.path, offset: offset * SECTOR });
    const length = data.length / SECTOR;
    this.check(offset, length);
    let s = offset;
    while (s < offset + length) {
      const pieceEnd = pieceBase + (Math.floor((s - pieceBase) / PIECE_SECTORS) + 1) * PIECE_SECTORS;
      const n = Math.min(pieceEnd, offset + length) - s;
      this.entries.push({ offset: s, length: n, moffset: this.pos, zeroed: false, tag: 0 });
      this.append(data.subarray((s - offset) * SECTOR, (s - offset + n) * SECTOR));
      this.pos += n;
      s += n;
    }
  }

  private append(b: Uint8Array): void {
    if (this.bufLen + b.length > this.buf.length) this.flush();
    if (b.length > this.buf.length) {
      this.out.pwriteSync(b, this.bufStart);
      this.bufStart += b.length;
      return;
    }
    this.buf.set(b, this.bufLen);
    this.bufLen += b.length;
  }

  private flush(): void {
    if (this.bufLen === 0) return;
    this.out.pwriteSync(this.buf.subarray(0, this.bufLen), this.bufStart);
    this.bufStart += this.bufLen;
    this.bufLen = 0;
  }

  /**
   * Write index, trailer and header; fsync; close.
   * @returns the merged index (without padding) and the file size in bytes
   */
  async finish(): Promise<{ segments: Segment[]; size: number }> {
    this.flush();
    this.done = true;
    try {
      const merged = mergeNeighbours(this.entries);
      const padded = Math.ceil(merged.length / INDEX_PAGE_ENTRIES) * INDEX_PAGE_ENTRIES;
      const indexOffset = this.pos * SECTOR;
      const idx = encodeSegments(merged, padded);
      this.out.pwriteSync(idx, indexOffset);
      const m = { virtualSize: this.meta.virtualSize, uuid: this.meta.uuid ?? NULL_UUID, parentUuid: this.meta.parentUuid ?? NULL_UUID, userTag: this.meta.userTag };
      this.out.pwriteSync(encodeHeaderTrailer({ ...m, flags: HTFlag.DATA | HTFlag.SEALED, indexOffset, indexSize: padded }), indexOffset + idx.length);
      this.out.pwriteSync(encodeHeaderTrailer({ ...m, flags: HTFlag.HEADER | HTFlag.DATA | HTFlag.SEALED }), 0);
      this.target.publish();
      return { segments: merged, size: indexOffset + idx.length + HT_SIZE };
    } catch (e) {
      this.target.abort();
      throw e;
    }
  }

  /** Abandon the output: nothing appears at `path`. */
  async abort(): Promise<void> {
    this.done = true;
    this.target.abort();
  }
}

/**
 * Compact `segments` (sorted; sectors) into a committed layer at `outPath`, reading each data
 * segment's bytes with `read(buf, seg, sectorWithinSeg)`.
 * @returns the merged index and file size
 */
export async function writeCommitted(
  outPath: string,
  segments: readonly Segment[],
  read: (buf: Uint8Array, seg: Segment, delta: number) => Promise<void>,
  meta: CommitMeta,
): Promise<{ segments: Segment[]; size: number }> {
  const w = new CommittedLayerWriter(outPath, meta);
  try {
    const chunk = new Uint8Array(WRITE_BUFFER); // a multiple of 32 KiB, so pieces keep their boundaries
    for (const s of segments) {
      if (s.zeroed) {
        w.addZeroed(s.offset, s.length);
        continue;
      }
      for (let d = 0; d < s.length; d += chunk.length / SECTOR) {
        const n = Math.min(chunk.length / SECTOR, s.length - d);
        const b = chunk.subarray(0, n * SECTOR);
        await read(b, s, d);
        w.addData(s.offset + d, b, s.offset);
      }
    }
  } catch (e) {
    await w.abort();
    throw e;
  }
  return w.finish();
}
