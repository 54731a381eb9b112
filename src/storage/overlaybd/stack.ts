/**
 * A stack of read-only LSMT layers with an optional writable upper, served as one BlockImage
 * (overlaybd-format.md 2.7): top-down resolution, zeroed segments read as zeros, unmapped ranges
 * fall through, past every layer zeros. The RO layers' indexes are merged once at open; the
 * upper's index is consulted first and its gaps filled from the merged index.
 */
import type { BlockImage } from "../block.ts";
import { LocalFile } from "./backend.ts";
import { type CommitMeta, writeCommitted } from "./commit.ts";
import { fail } from "./errors.ts";
import { MAX_LAYERS, NULL_UUID, SECTOR, type Segment } from "./format.ts";
import { openRoLayerFile, type RoLayer } from "./layer.ts";
import { RwLayer } from "./rw.ts";
import { firstEndingAfter, overlay } from "./segments.ts";
import { reflinkOrCopy } from "./reflink.ts";
import type { IoUring, ReadRequest } from "../../ffi/io_uring.ts";
/**
 * A layer file returned fewer bytes than its index maps: it was truncated (or replaced) after it
 * was opened. The image never answers with bytes it does not hold.
 * @throws OverlaybdError `overlaybd.truncated` naming the file and the offset where its data ends
 */
function shortRead(file: string, fileOffset: number, want: number, got: number): never {
  fail("truncated", `short read: ${got} of ${want} bytes; the file ends inside the image's data`, { file, offset: fileOffset + Math.max(0, got), wanted: want, got });
}

/** Shared empty list for synchronous reads (nothing is ever pushed: every layer is sync). */
const NO_PENDING: Promise<void>[] = [];
/** Write/discard unit of a sparse upper (bytes): the filesystem block its holes are found in. */
const SPARSE_BLOCK = 4096;

/** Paths of a writable upper layer. */
export interface UpperPaths {
  data: string;
  index: string;
}

/** What `openStack` accepts. */
export interface StackOptions {
  /** Read-only layers, bottom first: paths or already-open layers. */
  lowers: Array<string | RoLayer>;
  /** Writable upper layer; absent = read-only image. */
  upper?: UpperPaths;
  /**
   * Open the upper's files read-only and refuse writes (the image is read-only, the upper's data
   * is read): one of several readers of an image another process may write later, never at once.
   */
  upperReadOnly?: boolean;
  /** Check that each layer's parent_uuid names the layer below when both are set (stack_files). */
  verifyChain?: boolean;
}

/**
 * Overlay layers into one sorted index; layer i (bottom first) gets tag i.
 * @throws OverlaybdError `too_many_layers` beyond 255
 */
export function mergeLayers(layers: readonly RoLayer[]): Segment[] {
  if (layers.length > MAX_LAYERS) fail("too_many_layers", `a stack holds at most ${MAX_LAYERS} layers, got ${layers.length}`, { layers: layers.length });
  let merged: Segment[] = [];
  layers.forEach((l, i) => {
    merged = overlay(l.segments.map((s) => ({ ...s, tag: i })), merged);
  });
  return merged;
}

/** An overlaybd image: RO layers plus an optional writable upper. Implements `BlockImage`. */
export class LayeredImage implements BlockImage {
  private layers: RoLayer[];
  private merged: Segment[];
  private upper: RwLayer | null;
  private _size: number;
  private closed = false;
  private readonly pendingScratch: Promise<void>[] = [];
  /** When set, local-file pieces are queued here instead of read (batched reads). */
  private collect: ReadRequest[] | null = null;
  /** The file name of each collected piece (for errors). */
  private collectNames: string[] = [];

  /** @param upperReadOnly the upper was opened read-only: reads see it, writes are refused */
  constructor(
    layers: RoLayer[],
    upper: RwLayer | null,
    private readonly upperReadOnly = false,
  ) {
    this.layers = layers;
    this.merged = mergeLayers(layers);
    this.upper = upper;
    this._size = LayeredImage.computeSize(layers, upper);
  }

  private static computeSize(layers: readonly RoLayer[], upper: RwLayer | null): number {
    if (upper && upper.virtualSize > 0) return upper.virtualSize;
    for (let i = layers.length - 1; i >= 0; i--) if (layers[i]!.trailer.virtualSize > 0) return layers[i]!.trailer.virtualSize;
    return 0;
  }

  /** Virtual size in bytes. */
  get size(): number {
    return this._size;
  }

  get readOnly(): boolean {
    return this.upper === null || this.upperReadOnly;
  }

  /** The read-only layers, bottom first. */
  get lowers(): readonly RoLayer[] {
    return this.layers;
  }

  /** The writable layer, if any. */
  get writable(): RwLayer | null {
    return this.upper;
  }

  /** The merged read-only index (tags = layer numbers, bottom first). */
  get roIndex(): readonly Segment[] {
    return this.merged;
  }

  private where(): string {
    return this.upper ? this.upper.data.name : (this.layers[this.layers.length - 1]?.name ?? "(empty stack)");
  }

  private checkRange(offset: number, length: number, op: string): void {
    if (this.closed) fail("closed", `${op} on a closed image`, { file: this.where() });
    if (!Number.isSafeInteger(offset) || offset < 0 || !Number.isSafeInteger(length) || length < 0) {
      fail("bad_range", `${op}: bad offset ${offset} / length ${length}`, { file: this.where(), offset, length });
    }
  }

  /**
   * Read virtual bytes at `offset` into `buf`. Any offset and length; a read that crosses the
   * virtual size is short, one at exactly the size returns 0 (end of disk), one that starts past
   * it throws `overlaybd.out_of_range` (the same rules as the raw-file image).
   */
  pread(buf: Uint8Array, offset: number): Promise<number> {
    // not `async`: when every piece was read synchronously this costs one resolved promise
    try {
      this.checkRange(offset, buf.length, "read");
      if (buf.length === 0 || offset === this._size) return Promise.resolve(0);
      if (offset > this._size) fail("out_of_range", `read at ${offset} is past the virtual size ${this._size}`, { file: this.where(), offset, size: this._size });
      const end = Math.min(offset + buf.length, this._size);
      // the traversal is synchronous, so one scratch list serves every call
      const pending = this.pendingScratch;
      if (this.upper) this.readUpper(buf, offset, offset, end, pending);
      else this.readLowers(buf, offset, offset, end, pending);
      if (pending.length > 0) return Promise.all(pending.splice(0)).then(() => end - offset);
      return Promise.resolve(end - offset);
    } catch (e) {
      this.pendingScratch.length = 0;
      return Promise.reject(e);
    }
  }

  /**
   * Synchronous `pread` for callers on a hot path (FUSE/ublk workers) when every layer is local
   * (`syncReadable`). Same range rules as `pread`.
   * @throws OverlaybdError `not_sync` when a layer needs asynchronous reads (registry)
   */
  preadSync(buf: Uint8Array, offset: number): number {
    this.checkRange(offset, buf.length, "read");
    if (buf.length === 0 || offset === this._size) return 0;
    if (offset > this._size) fail("out_of_range", `read at ${offset} is past the virtual size ${this._size}`, { file: this.where(), offset, size: this._size });
    if (!this.syncReadable) fail("not_sync", "a layer of this image needs asynchronous reads", { file: this.where() });
    const end = Math.min(offset + buf.length, this._size);
    if (this.upper) this.readUpper(buf, offset, offset, end, NO_PENDING);
    else this.readLowers(buf, offset, offset, end, NO_PENDING);
    return end - offset;
  }

  /**
   * Read several ranges at once through `ring`: every piece that lives in a plain local layer
   * file (or the upper) goes into one io_uring batch; ZFile pieces are decoded inline. Same range
   * rules as `pread`; for queue-depth-N servers (ublk) on local layers.
   * @returns bytes read per request
   * @throws OverlaybdError `not_sync` (a remote layer), `out_of_range`; IoUringError from the ring
   */
  preadBatchSync(reqs: ReadonlyArray<{ buf: Uint8Array; offset: number }>, ring: IoUring): number[] {
    if (!this.syncReadable) fail("not_sync", "a layer of this image needs asynchronous reads", { file: this.where() });
    const pieces: ReadRequest[] = [];
    const sizes: number[] = [];
    this.collect = pieces;
    this.collectNames = [];
    try {
      for (const r of reqs) {
        this.checkRange(r.offset, r.buf.length, "read");
        if (r.buf.length === 0 || r.offset === this._size) {
          sizes.push(0);
          continue;
        }
        if (r.offset > this._size) fail("out_of_range", `read at ${r.offset} is past the virtual size ${this._size}`, { file: this.where(), offset: r.offset, size: this._size });
        const end = Math.min(r.offset + r.buf.length, this._size);
        if (this.upper) this.readUpper(r.buf, r.offset, r.offset, end, NO_PENDING);
        else this.readLowers(r.buf, r.offset, r.offset, end, NO_PENDING);
        sizes.push(end - r.offset);
      }
    } finally {
      this.collect = null;
    }
    const names = this.collectNames;
    for (let i = 0; i < pieces.length; i += ring.entries) {
      const part = pieces.slice(i, i + ring.entries);
      const got = ring.readBatch(-1, part);
      part.forEach((p, k) => {
        if (got[k]! < p.length) shortRead(names[i + k]!, p.offset, p.length, got[k]!);
      });
    }
    return sizes;
  }

  /** True when every layer can be read without waiting (all local files). */
  get syncReadable(): boolean {
    return this.layers.every((l) => l.lsmt.preadSync !== undefined);
  }

  private readUpper(buf: Uint8Array, base: number, from: number, to: number, pending: Promise<void>[]): void {
    const up = this.upper!;
    const segs = up.segments;
    let pos = from;
    for (let i = firstEndingAfter(segs, Math.floor(from / SECTOR)); i < segs.length && pos < to; i++) {
      const s = segs[i]!;
      const sStart = s.offset * SECTOR;
      if (sStart >= to) break;
      if (sStart > pos) {
        this.readLowers(buf, base, pos, sStart, pending);
        pos = sStart;
      }
      const e = Math.min(sStart + s.length * SECTOR, to);
      if (s.zeroed) buf.fill(0, pos - base, e - base);
      else if (this.collect) {
        this.collect.push({ fd: up.data.fd, buf, bufOffset: pos - base, length: e - pos, offset: s.moffset * SECTOR + (pos - sStart) });
        this.collectNames.push(up.data.name);
      } else {
        const off = s.moffset * SECTOR + (pos - sStart);
        const n = up.readDataAt(buf, pos - base, e - pos, off);
        if (n < e - pos) shortRead(up.data.name, off, e - pos, n);
      }
      pos = e;
    }
    if (pos < to) this.readLowers(buf, base, pos, to, pending);
  }

  private readLowers(buf: Uint8Array, base: number, from: number, to: number, pending: Promise<void>[]): void {
    const segs = this.merged;
    let pos = from;
    for (let i = firstEndingAfter(segs, Math.floor(from / SECTOR)); i < segs.length && pos < to; i++) {
      const s = segs[i]!;
      const sStart = s.offset * SECTOR;
      if (sStart >= to) break;
      if (sStart > pos) {
        buf.fill(0, pos - base, sStart - base);
        pos = sStart;
      }
      const e = Math.min(sStart + s.length * SECTOR, to);
      if (s.zeroed) buf.fill(0, pos - base, e - base);
      else {
        const b = this.layers[s.tag]!.lsmt;
        const off = s.moffset * SECTOR + (pos - sStart);
        if (this.collect && b instanceof LocalFile) {
          this.collect.push({ fd: b.fd, buf, bufOffset: pos - base, length: e - pos, offset: off });
          this.collectNames.push(b.name);
          pos = e;
          continue;
        }
        if (b.preadSyncAt) {
          const n = b.preadSyncAt(buf, pos - base, e - pos, off);
          if (n < e - pos) shortRead(b.name, off, e - pos, n);
          pos = e;
          continue;
        }
        const view = buf.subarray(pos - base, e - base);
        if (b.preadSync) {
          const n = b.preadSync(view, off);
          if (n < view.length) shortRead(b.name, off, view.length, n);
        } else pending.push(b.pread(view, off).then((n) => void (n < view.length && shortRead(b.name, off, view.length, n))));
      }
      pos = e;
    }
    if (pos < to) buf.fill(0, pos - base, to - base);
  }

  private requireUpper(op: string): RwLayer {
    if (this.closed) fail("closed", `${op} on a closed image`, { file: this.where() });
    if (!this.upper || this.upperReadOnly) fail("read_only", `${op} on a read-only image`, { file: this.where() });
    return this.upper;
  }

  /**
   * Write `buf` at virtual `offset`. Unaligned edges are read-modify-written.
   * @throws OverlaybdError `read_only`, `out_of_range` (past the virtual size)
   */
  async pwrite(buf: Uint8Array, offset: number): Promise<number> {
    const up = this.requireUpper("write");
    this.checkRange(offset, buf.length, "write");
    if (buf.length === 0) return 0;
    if (offset + buf.length > this._size) fail("out_of_range", `write of ${buf.length} bytes at ${offset} is past the virtual size ${this._size}`, { file: up.data.name, offset, size: this._size });
    // a sparse upper maps whole filesystem blocks, so it is written in whole 4 KiB blocks
    const A = up.sparse ? SPARSE_BLOCK : SECTOR;
    const a = Math.floor(offset / A) * A;
    const b = Math.min(Math.ceil((offset + buf.length) / A) * A, Math.max(this._size, offset + buf.length));
    if (a === offset && b === offset + buf.length) {
      up.writeAligned(buf, offset);
      return buf.length;
    }
    const tmp = new Uint8Array(b - a);
    await this.pread(tmp.subarray(0, Math.min(A, tmp.length)), a);
    if (b - A > a) await this.pread(tmp.subarray(tmp.length - A), b - A);
    tmp.set(buf, offset - a);
    up.writeAligned(tmp, a);
    return buf.length;
  }

  /** Make [offset, offset+length) read as zeros: zeroed entries for whole sectors, zero writes at the edges. */
  async discard(offset: number, length: number): Promise<void> {
    const up = this.requireUpper("discard");
    this.checkRange(offset, length, "discard");
    if (offset + length > this._size) fail("out_of_range", `discard of ${length} bytes at ${offset} is past the virtual size ${this._size}`, { file: up.data.name, offset, size: this._size });
    const A = up.sparse ? SPARSE_BLOCK : SECTOR;
    const a = Math.ceil(offset / A) * A;
    const b = Math.floor((offset + length) / A) * A;
    if (a >= b) {
      if (length > 0) await this.pwrite(new Uint8Array(length), offset);
      return;
    }
    if (a > offset) await this.pwrite(new Uint8Array(a - offset), offset);
    up.discardAligned(a, b - a);
    if (up.sparse) {
      // a punched hole falls through to the lowers: zero what they hold there explicitly
      for (const [x, y] of this.lowerDataRanges(a, b)) {
        for (let p = x; p < y; p += 1 << 20) up.writeAligned(new Uint8Array(Math.min(1 << 20, y - p)), p);
      }
    }
    if (offset + length > b) await this.pwrite(new Uint8Array(offset + length - b), b);
  }

  async sync(): Promise<void> {
    if (this.closed) fail("closed", "sync on a closed image", { file: this.where() });
    if (!this.upperReadOnly) this.upper?.sync();
  }

  /** `await using img = await openStack(...)` closes the image at scope end. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.upper?.close();
    const seen = new Set<unknown>();
    for (const l of this.layers) {
      if (seen.has(l.lsmt)) continue;
      seen.add(l.lsmt);
      await l.lsmt.close();
    }
  }

  /**
   * The effective mapping of the whole image (upper over lowers), sorted; tags are layer numbers
   * bottom first, the upper being `lowers.length`.
   */
  effectiveSegments(): Segment[] {
    if (!this.upper) return this.merged;
    const t = this.layers.length;
    return overlay(this.upper.segments.map((s) => ({ ...s, tag: t })), this.merged);
  }

  /**
   * Byte ranges inside [from, to) whose content comes from stored data (not zeroed, not unmapped).
   * Everything else in the range reads as zeros.
   */
  dataRanges(from: number, to: number): Array<[number, number]> {
    const out: Array<[number, number]> = [];
    const segs = this.effectiveSegments();
    for (let i = firstEndingAfter(segs, Math.floor(from / SECTOR)); i < segs.length; i++) {
      const s = segs[i]!;
      const a = Math.max(s.offset * SECTOR, from), b = Math.min((s.offset + s.length) * SECTOR, to);
      if (a >= to) break;
      if (!s.zeroed && a < b) out.push([a, b]);
    }
    return out;
  }

  /** Byte ranges in [from, to) where the read-only layers hold data. */
  private lowerDataRanges(from: number, to: number): Array<[number, number]> {
    const out: Array<[number, number]> = [];
    const segs = this.merged;
    for (let i = firstEndingAfter(segs, Math.floor(from / SECTOR)); i < segs.length; i++) {
      const s = segs[i]!;
      const a = Math.max(s.offset * SECTOR, from), b = Math.min((s.offset + s.length) * SECTOR, to);
      if (a >= to) break;
      if (!s.zeroed && a < b) out.push([a, b]);
    }
    return out;
  }

  private async readSegment(buf: Uint8Array, s: Segment, delta: number): Promise<void> {
    const off = (s.moffset + delta) * SECTOR;
    const upper = s.tag === this.layers.length;
    const n = upper ? this.upper!.readData(buf, off) : await this.layers[s.tag]!.lsmt.pread(buf, off);
    if (n < buf.length) shortRead(upper ? this.upper!.data.name : this.layers[s.tag]!.lsmt.name, off, buf.length, n);
  }

  /**
   * Write the upper layer's live data as a committed layer at `outPath` (overlaybd-commit).
   * With `flatten`, write the whole image (every layer) as one layer instead. Syncs first.
   * @throws OverlaybdError `read_only` (no upper and no flatten), `open_failed` when `outPath` exists
   */
  async commit(outPath: string, opts: { flatten?: boolean; meta?: Partial<CommitMeta> } = {}): Promise<{ segments: Segment[]; size: number }> {
    if (this.closed) fail("closed", "commit on a closed image", { file: this.where() });
    if (!opts.flatten && !this.upper) fail("read_only", "nothing to commit: the image has no writable layer", { file: this.where() });
    this.upper?.sync();
    const h = this.upper?.header;
    const meta: CommitMeta = {
      virtualSize: this._size,
      uuid: opts.meta?.uuid ?? h?.uuid,
      parentUuid: opts.meta?.parentUuid ?? (opts.flatten ? NULL_UUID : h?.parentUuid),
      userTag: opts.meta?.userTag,
    };
    if (opts.flatten) {
      const segs = this.effectiveSegments();
      // unmapped ranges and zeroed entries of the bottom need no entry; keep zeroed ones that hide data
      return writeCommitted(outPath, segs, (b, s, d) => this.readSegment(b, s, d), meta);
    }
    const t = this.layers.length;
    return writeCommitted(outPath, this.upper!.segments.map((s) => ({ ...s, tag: t })), (b, s, d) => this.readSegment(b, s, d), meta);
  }

  /**
   * Grow the virtual size to `newSize` bytes, recorded in the upper's headers (a reopened stack
   * keeps it). The new range reads as zeros (or the lowers' bytes, where they are larger) until
   * written.
   * @throws OverlaybdError `read_only` (no writable upper), `bad_size` (unaligned, or below the current size), `closed`
   */
  async grow(newSize: number): Promise<void> {
    const up = this.requireUpper("grow");
    if (newSize < this._size) fail("bad_size", `cannot shrink the image from ${this._size} to ${newSize} bytes`, { file: up.data.name, virtualSize: newSize, current: this._size });
    up.grow(newSize);
    this._size = newSize;
  }

  /**
   * Restack: turn the upper into the new top read-only layer and start an empty upper at `next`
   * whose parent is that layer. With `layerPath` the upper is committed (compacted) into that
   * new file and the old pair is left for the caller to delete; with `null` it is sealed in
   * place and its data file becomes the layer (no copy; its index file is no longer needed).
   * @returns the path of the new read-only layer
   * @throws OverlaybdError `read_only` when there is no upper, `too_many_layers` past 255
   */
  async restack(layerPath: string | null, next: UpperPaths): Promise<string> {
    const up = this.requireUpper("restack");
    if (this.layers.length + 1 > MAX_LAYERS) fail("too_many_layers", `a stack holds at most ${MAX_LAYERS} layers`, { file: up.data.name });
    let path: string;
    if (layerPath === null) {
      path = up.data.name;
      await up.seal();
    } else {
      path = layerPath;
      const uuid = up.header.uuid && up.header.uuid !== NULL_UUID ? up.header.uuid : undefined;
      await this.commit(layerPath, { meta: { uuid } });
    }
    const layer = await openRoLayerFile(path);
    const fresh = await RwLayer.create(next.data, next.index, { virtualSize: this._size, parentUuid: layer.trailer.uuid, sparse: up.sparse });
    await up.close();
    this.layers = [...this.layers, layer];
    this.merged = overlay(layer.segments.map((s) => ({ ...s, tag: this.layers.length - 1 })), this.merged);
    this.upper = fresh;
    return path;
  }

  /**
   * Copy the live upper pair to `dst` (sync first), by reflink where the filesystem supports
   * FICLONE, else by plain copy.
   * @returns how each file was copied
   */
  async snapshotUpper(dst: UpperPaths): Promise<"reflink" | "copy"> {
    const up = this.requireUpper("snapshot");
    up.sync();
    let how: "reflink" | "copy" = "reflink";
    for (const [src, to] of [[up.data, dst.data], [up.index, dst.index]] as const) {
      if (reflinkOrCopy(src, to) === "copy") how = "copy";
    }
    return how;
  }
}

/**
 * Open an image from layer paths (bottom first) and an optional writable upper.
 * @throws OverlaybdError from any layer, `bad_chain` when `verifyChain` finds a UUID mismatch
 */
export async function openStack(opts: StackOptions): Promise<LayeredImage> {
  const layers: RoLayer[] = [];
  const opened: RoLayer[] = [];
  let upper: RwLayer | null = null;
  try {
    for (const l of opts.lowers) {
      if (typeof l === "string") {
        const r = await openRoLayerFile(l);
        opened.push(r);
        layers.push(r);
      } else layers.push(l);
    }
    if (opts.upper) upper = await RwLayer.open(opts.upper.data, opts.upper.index, { readOnly: opts.upperReadOnly === true });
    if (opts.verifyChain) {
      const chain = [...layers.map((l) => ({ name: l.name, uuid: l.trailer.uuid, parent: l.trailer.parentUuid })),
        ...(upper ? [{ name: upper.data.name, uuid: upper.header.uuid, parent: upper.header.parentUuid }] : [])];
      for (let i = 1; i < chain.length; i++) {
        const below = chain[i - 1]!, cur = chain[i]!;
        if (below.uuid !== NULL_UUID && cur.parent !== NULL_UUID && below.uuid.toUpperCase() !== cur.parent.toUpperCase()) {
          fail("bad_chain", `layer ${cur.name} has parent ${cur.parent} but the layer below is ${below.uuid}`, { file: cur.name, offset: 93, parent: cur.parent, below: below.uuid });
        }
      }
    }
    return new LayeredImage(layers, upper, opts.upperReadOnly === true);
  } catch (e) {
    await upper?.close();
    for (const l of opened) await l.lsmt.close();
    throw e;
  }
}

/**
 * Create an empty writable upper pair of `virtualSize` bytes (overlaybd-create).
 * @throws OverlaybdError `bad_size`, `open_failed` (a file exists)
 */
export async function createUpper(paths: UpperPaths, virtualSize: number, opts: { uuid?: string; parentUuid?: string; sparse?: boolean } = {}): Promise<void> {
  const l = await RwLayer.create(paths.data, paths.index, { virtualSize, ...opts });
  await l.close();
}
