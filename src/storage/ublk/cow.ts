/**
 * A raw file with chunked copy-on-write over a read-only origin (the seeds' BasicCowTarget): the
 * device reads the origin until a chunk is first written; then the whole chunk is copied into a
 * sparse CoW file of the same size (at the same offset) and served from there. Per-chunk state
 * ORIGIN -> COPYING -> COW lives in a shared Int32Array, so every queue thread and the main
 * thread agree and a chunk is copied once (a thread finding it COPYING waits for the copier).
 * Adjacent chunks in the same state are read with one read.
 *
 * Persistence needs no map file: a chunk is COW when the CoW file holds data over all of it
 * (SEEK_DATA/SEEK_HOLE at open). The copy writes the whole chunk, so the allocation that marks it
 * is made by the same write as its data: a killed server's replacement sees every completed
 * write (page cache), and after a power loss a journalled filesystem in ordered mode (ext4
 * default) never shows allocated blocks without their data. A chunk found partly allocated (a copy
 * cut short) reads from the origin again. Discard is not offered (a punched hole would fall back
 * to the origin); the file system must report holes (checked when the CoW file is created).
 */
import { closeSync, existsSync, fdatasyncSync, fstatSync, ftruncateSync, openSync, readSync, writeSync, constants as fsc } from "node:fs";
import type { BlockImage } from "../block.ts";
import { dataExtents } from "../../ffi/file_extents.ts";
import { UblkError } from "./errors.ts";
import type { CowPlan, PlanFile, ReadPiece } from "./plan.ts";
import { errorMessage } from "../../util/error.ts";

/** Chunk read from the origin. */
export const CHUNK_ORIGIN = 0;
/** Chunk being copied by some thread; wait for it. */
export const CHUNK_COPYING = 1;
/** Chunk read from and written to the CoW file. */
export const CHUNK_COW = 2;
/** File indexes of `ReadPiece.file` for a CoW target. */
export const COW_FILE_ORIGIN = 0, COW_FILE_COW = 1;
/** Longest wait for another thread's chunk copy, ms, before it counts as failed. */
const COPY_WAIT_MS = 30_000;
const O_CLOEXEC = 0o2000000;

/** The state a CoW target's I/O functions work on (the plan, with its views). */
export interface CowFiles {
  size: number;
  chunkBytes: number;
  origin: PlanFile;
  cow: PlanFile;
  state: Int32Array;
}

/** Views of a plan cloned into a thread. */
export function cowFilesOf(p: CowPlan): CowFiles {
  return { size: p.size, chunkBytes: p.chunkBytes, origin: p.origin, cow: p.cow, state: new Int32Array(p.state) };
}

function ioFailed(what: string, file: string, offset: number, cause: unknown): UblkError {
  return new UblkError("ublk.io_failed", `${what} ${file} at ${offset}: ${errorMessage(cause)}`, { file, offset });
}

function readFull(f: PlanFile, buf: Uint8Array, offset: number): void {
  let done = 0;
  while (done < buf.length) {
    let n: number;
    try {
      n = readSync(f.fd, buf, done, buf.length - done, offset + done);
    } catch (e) {
      throw ioFailed("read of", f.name, offset + done, e);
    }
    if (n === 0) throw new UblkError("ublk.io_failed", `short read of ${f.name} at ${offset + done}: the file ends before the image does`, { file: f.name, offset: offset + done });
    done += n;
  }
}

function writeFull(f: PlanFile, buf: Uint8Array, offset: number): void {
  let done = 0;
  try {
    while (done < buf.length) done += writeSync(f.fd, buf, done, buf.length - done, offset + done);
  } catch (e) {
    throw ioFailed("write of", f.name, offset + done, e);
  }
}

/**
 * Split the read of [offset, offset+length) into pieces: runs of chunks in the same place
 * (origin or CoW file, both at the virtual offset) become one piece each.
 */
export function planCowRead(f: CowFiles, offset: number, length: number, out: ReadPiece[]): void {
  const end = offset + length, C = f.chunkBytes;
  let pos = offset;
  while (pos < end) {
    const src = Atomics.load(f.state, Math.floor(pos / C)) === CHUNK_COW ? COW_FILE_COW : COW_FILE_ORIGIN;
    let e = Math.min((Math.floor(pos / C) + 1) * C, end);
    while (e < end && (Atomics.load(f.state, e / C) === CHUNK_COW ? COW_FILE_COW : COW_FILE_ORIGIN) === src) e = Math.min(e + C, end);
    out.push({ file: src, fileOffset: pos, bufOffset: pos - offset, length: e - pos });
    pos = e;
  }
}

/**
 * Read [offset, offset+buf.length) synchronously.
 * @throws UblkError `ublk.io_failed` naming the file and offset
 */
export function cowRead(f: CowFiles, buf: Uint8Array, offset: number): void {
  const pieces: ReadPiece[] = [];
  planCowRead(f, offset, buf.length, pieces);
  for (const p of pieces) readFull(p.file === COW_FILE_COW ? f.cow : f.origin, buf.subarray(p.bufOffset, p.bufOffset + p.length), p.fileOffset);
}

/**
 * Write `buf` at `offset` (synchronously): chunks still on the origin are copied first (a chunk
 * the write covers whole is just written), consecutive chunks already in the CoW file take one
 * write.
 * @throws UblkError `ublk.io_failed` (the chunk then stays on the origin), `ublk.timeout` when
 * another thread's copy of a chunk does not finish
 */
export function cowWrite(f: CowFiles, buf: Uint8Array, offset: number): void {
  const end = offset + buf.length, C = f.chunkBytes;
  let runStart = -1; // start of a pending run of bytes in COW chunks, written in one go
  const flush = (upTo: number) => {
    if (runStart >= 0 && upTo > runStart) writeFull(f.cow, buf.subarray(runStart - offset, upTo - offset), runStart);
    runStart = -1;
  };
  for (let pos = offset; pos < end;) {
    const c = Math.floor(pos / C);
    const cs = c * C, ce = Math.min(cs + C, f.size);
    const we = Math.min(end, ce);
    for (;;) {
      const st = Atomics.load(f.state, c);
      if (st === CHUNK_COW) {
        if (runStart < 0) runStart = pos;
        break;
      }
      if (st === CHUNK_ORIGIN && Atomics.compareExchange(f.state, c, CHUNK_ORIGIN, CHUNK_COPYING) === CHUNK_ORIGIN) {
        flush(pos);
        try {
          if (pos === cs && we === ce) writeFull(f.cow, buf.subarray(pos - offset, we - offset), cs);
          else {
            const tmp = new Uint8Array(ce - cs);
            readFull(f.origin, tmp, cs);
            tmp.set(buf.subarray(pos - offset, we - offset), pos - cs);
            writeFull(f.cow, tmp, cs);
          }
          Atomics.store(f.state, c, CHUNK_COW);
        } catch (e) {
          Atomics.store(f.state, c, CHUNK_ORIGIN);
          throw e;
        } finally {
          Atomics.notify(f.state, c);
        }
        break;
      }
      if (Atomics.wait(f.state, c, CHUNK_COPYING, COPY_WAIT_MS) === "timed-out") {
        throw new UblkError("ublk.timeout", `chunk ${c} of ${f.cow.name} stayed in copy for ${COPY_WAIT_MS} ms`, { file: f.cow.name, offset: cs });
      }
    }
    pos = we;
  }
  flush(end);
}

/**
 * Make completed writes durable (fdatasync of the CoW file).
 * @throws UblkError `ublk.io_failed`
 */
export function cowFlush(f: CowFiles): void {
  try {
    fdatasyncSync(f.cow.fd);
  } catch (e) {
    throw ioFailed("fdatasync of", f.cow.name, 0, e);
  }
}

/** Chunk states of a CoW file: COW where data covers the whole chunk. */
function loadStates(cowFd: number, size: number, chunkBytes: number): SharedArrayBuffer {
  const n = Math.ceil(size / chunkBytes);
  const sab = new SharedArrayBuffer(4 * n);
  const st = new Int32Array(sab);
  for (const [a, b] of dataExtents(cowFd, size)) {
    for (let c = Math.ceil(a / chunkBytes); c < n && c * chunkBytes < b; c++) {
      if (Math.min((c + 1) * chunkBytes, size) <= b) st[c] = CHUNK_COW;
    }
  }
  return sab;
}

/** Where a CoW target's files are. */
export interface CowOptions {
  /** Read-only origin: a raw image whose size (a multiple of 512) is the device's size. */
  origin: string;
  /** The CoW file (same size, sparse). */
  cow: string;
  /** Copy-on-write unit in bytes (a power of two, 4096..4 MiB). */
  chunkBytes: number;
  /** Create the CoW file when it does not exist (else a missing file is an error). */
  create?: boolean;
}

/** A CoW target as a BlockImage; `plan()` hands its files and shared chunk states to queue threads. */
export class CowImage implements BlockImage {
  readonly size: number;
  readonly readOnly = false;
  readonly chunkBytes: number;
  #files: CowFiles;
  #state: SharedArrayBuffer;
  #closed = false;

  private constructor(files: CowFiles, state: SharedArrayBuffer) {
    this.#files = files;
    this.#state = state;
    this.size = files.size;
    this.chunkBytes = files.chunkBytes;
  }

  /**
   * Open (or create) a CoW target.
   * @throws UblkError `ublk.bad_config` (chunk size), `ublk.target_failed` (missing or unreadable
   * files, sizes not matching or not a multiple of 512, a file system without hole reporting)
   */
  static open(opts: CowOptions): CowImage {
    const C = opts.chunkBytes;
    if (!Number.isInteger(C) || C < 4096 || C > 4 << 20 || (C & (C - 1)) !== 0) throw new UblkError("ublk.bad_config", `CoW chunk of ${C} bytes is not a power of two in 4096..4194304`, { chunkBytes: C });
    const fail = (msg: string, file: string, cause?: unknown): never => {
      throw new UblkError("ublk.target_failed", cause ? `${msg}: ${errorMessage(cause)}` : msg, { file });
    };
    let originFd = -1, cowFd = -1;
    try {
      try {
        originFd = openSync(opts.origin, fsc.O_RDONLY | O_CLOEXEC);
      } catch (e) {
        fail(`cannot open origin ${opts.origin}`, opts.origin, e);
      }
      const size = fstatSync(originFd).size;
      if (size === 0 || size % 512 !== 0) fail(`origin ${opts.origin} size ${size} is not a positive multiple of 512`, opts.origin);
      const created = !existsSync(opts.cow);
      if (created && !opts.create) fail(`CoW file ${opts.cow} does not exist`, opts.cow);
      try {
        cowFd = openSync(opts.cow, fsc.O_RDWR | O_CLOEXEC | (created ? fsc.O_CREAT | fsc.O_EXCL : 0), 0o600);
      } catch (e) {
        fail(`cannot open CoW file ${opts.cow}`, opts.cow, e);
      }
      if (created) {
        ftruncateSync(cowFd, size);
        if (dataExtents(cowFd, size).length > 0) fail(`the file system of ${opts.cow} does not report holes (SEEK_DATA): a CoW file needs one that does`, opts.cow);
      } else if (fstatSync(cowFd).size !== size) fail(`CoW file ${opts.cow} is ${fstatSync(cowFd).size} bytes, the origin ${size}`, opts.cow);
      const state = loadStates(cowFd, size, C);
      const files: CowFiles = { size, chunkBytes: C, origin: { fd: originFd, name: opts.origin }, cow: { fd: cowFd, name: opts.cow }, state: new Int32Array(state) };
      return new CowImage(files, state);
    } catch (e) {
      if (cowFd >= 0) closeSync(cowFd);
      if (originFd >= 0) closeSync(originFd);
      throw e;
    }
  }

  /** Chunks already copied (in the CoW file). */
  get copiedChunks(): number {
    let n = 0;
    for (let i = 0; i < this.#files.state.length; i++) if (Atomics.load(this.#files.state, i) === CHUNK_COW) n++;
    return n;
  }

  /** The plan queue threads serve this target with (valid until `close()`). */
  plan(): CowPlan {
    const f = this.#files;
    return { kind: "cow", size: f.size, chunkBytes: f.chunkBytes, origin: f.origin, cow: f.cow, state: this.#state };
  }

  #check(offset: number, length: number): void {
    if (this.#closed) throw new UblkError("ublk.io_failed", `CoW image ${this.#files.cow.name} is closed`, { file: this.#files.cow.name });
    if (!Number.isSafeInteger(offset) || offset < 0 || length < 0 || offset + length > this.size) {
      throw new UblkError("ublk.out_of_range", `range ${offset}+${length} is outside ${this.#files.cow.name} (${this.size} bytes)`, { file: this.#files.cow.name, offset, length, size: this.size });
    }
  }

  async pread(buf: Uint8Array, offset: number): Promise<number> {
    const n = Math.max(0, Math.min(buf.length, this.size - offset));
    this.#check(offset, n);
    cowRead(this.#files, n === buf.length ? buf : buf.subarray(0, n), offset);
    return n;
  }

  async pwrite(buf: Uint8Array, offset: number): Promise<number> {
    this.#check(offset, buf.length);
    cowWrite(this.#files, buf, offset);
    return buf.length;
  }

  /** Writes zeros (chunks become CoW chunks of zeros): a hole would read the origin again. */
  async discard(offset: number, length: number): Promise<void> {
    this.#check(offset, length);
    const zeros = new Uint8Array(Math.min(length, 1 << 20));
    for (let at = 0; at < length; at += zeros.length) cowWrite(this.#files, zeros.subarray(0, Math.min(zeros.length, length - at)), offset + at);
  }

  async sync(): Promise<void> {
    if (!this.#closed) cowFlush(this.#files);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    closeSync(this.#files.cow.fd);
    closeSync(this.#files.origin.fd);
  }
}
