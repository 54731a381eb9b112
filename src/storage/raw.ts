/**
 * A BlockImage over one plain file (no layers): the raw format QEMU/Firecracker read directly.
 * Used for tests of the FUSE export and for disks that need no copy-on-write. Discard writes
 * zeros (same read-back contract as a punched hole, without a fallocate binding).
 */
import { closeSync, fdatasyncSync, fstatSync, fsyncSync, ftruncateSync, openSync, readSync, writeSync, constants as fsc } from "node:fs";
import type { BlockImage } from "./block.ts";
import { DiskError } from "./errors.ts";
import { errorCode, errorMessage } from "../util/error.ts";

/** Largest zero-fill chunk used by discard, in bytes. */
const ZERO_CHUNK = 1 << 20;

/** A raw file opened read-only or read-write. Size = the file's size at open (or as grown). */
export class RawFileImage implements BlockImage {
  readonly readOnly: boolean;
  readonly path: string;
  #fd: number;
  #closed = false;
  #size: number;

  private constructor(path: string, fd: number, readOnly: boolean) {
    this.path = path;
    this.#fd = fd;
    this.readOnly = readOnly;
    this.#size = fstatSync(fd).size;
  }

  /** Virtual size in bytes. */
  get size(): number {
    return this.#size;
  }

  /**
   * Open `path`.
   * @throws DiskError `disk.open_failed` (missing file, permissions), `disk.bad_spec` (size not a multiple of 512)
   */
  static open(path: string, opts: { readOnly: boolean }): RawFileImage {
    let fd: number;
    try {
      fd = openSync(path, (opts.readOnly ? fsc.O_RDONLY : fsc.O_RDWR) | 0o2000000 /* O_CLOEXEC */);
    } catch (e) {
      throw new DiskError("disk.open_failed", `cannot open ${path}: ${errorMessage(e)}`, { path, code: errorCode(e) });
    }
    const img = new RawFileImage(path, fd, opts.readOnly);
    if (img.size % 512 !== 0) {
      closeSync(fd);
      throw new DiskError("disk.bad_spec", `raw image ${path} size ${img.size} is not a multiple of 512`, { path, size: img.size });
    }
    return img;
  }

  #check(offset: number, length: number): void {
    if (this.#closed) throw new DiskError("disk.io_failed", `image ${this.path} is closed`, { path: this.path });
    if (!Number.isSafeInteger(offset) || offset < 0 || length < 0 || offset + length > this.size) {
      throw new DiskError("disk.out_of_range", `range ${offset}+${length} outside ${this.path} (${this.size} bytes)`, { path: this.path, offset, length, size: this.size });
    }
  }

  async pread(buf: Uint8Array, offset: number): Promise<number> {
    const len = Math.max(0, Math.min(buf.byteLength, this.size - offset));
    this.#check(offset, len);
    let done = 0;
    while (done < len) {
      const n = readSync(this.#fd, buf, done, len - done, offset + done);
      if (n === 0) break;
      done += n;
    }
    return done;
  }

  /**
   * The open file itself, for servers that read and write it from other threads (the FUSE
   * export's reader threads): bytes map 1:1 to file offsets. The fd stays valid until `close()`;
   * null once closed.
   */
  directFile(): { fd: number; readOnly: boolean } | null {
    return this.#closed ? null : { fd: this.#fd, readOnly: this.readOnly };
  }

  async pwrite(buf: Uint8Array, offset: number): Promise<number> {
    if (this.readOnly) throw new DiskError("disk.read_only", `image ${this.path} is read-only`, { path: this.path, offset });
    this.#check(offset, buf.byteLength);
    let done = 0;
    while (done < buf.byteLength) done += writeSync(this.#fd, buf, done, buf.byteLength - done, offset + done);
    return done;
  }

  async discard(offset: number, length: number): Promise<void> {
    if (this.readOnly) throw new DiskError("disk.read_only", `image ${this.path} is read-only`, { path: this.path, offset });
    this.#check(offset, length);
    const zeros = new Uint8Array(Math.min(ZERO_CHUNK, length));
    for (let at = 0; at < length; at += zeros.byteLength) {
      await this.pwrite(zeros.subarray(0, Math.min(zeros.byteLength, length - at)), offset + at);
    }
  }

  /**
   * Grow the file to `newSize` bytes (the new range reads as zeros), synced.
   * @throws DiskError `disk.read_only`, `disk.bad_spec` (unaligned, or below the current size), `disk.io_failed`
   */
  async grow(newSize: number): Promise<void> {
    if (this.readOnly) throw new DiskError("disk.read_only", `image ${this.path} is read-only`, { path: this.path });
    if (this.#closed) throw new DiskError("disk.io_failed", `image ${this.path} is closed`, { path: this.path });
    if (!Number.isSafeInteger(newSize) || newSize % 512 !== 0 || newSize < this.#size) {
      throw new DiskError("disk.bad_spec", `cannot grow ${this.path} from ${this.#size} to ${newSize} bytes`, { path: this.path, size: this.#size, newSize });
    }
    ftruncateSync(this.#fd, newSize);
    fsyncSync(this.#fd);
    this.#size = newSize;
  }

  async sync(): Promise<void> {
    if (!this.#closed && !this.readOnly) fdatasyncSync(this.#fd);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    closeSync(this.#fd);
  }
}
