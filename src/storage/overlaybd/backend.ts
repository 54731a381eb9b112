/**
 * Byte-addressed storage under a layer: a local file, a tar member, a ZFile, a registry blob,
 * a cache. Offsets and lengths are in bytes. `preadSync` exists where the read can be done
 * without waiting (local files and what sits only on them), so the hot read path skips a
 * promise per call.
 */
import { closeSync, existsSync, fstatSync, ftruncateSync, fsyncSync, linkSync, openSync, readSync, rmSync, unlinkSync, writeSync, constants } from "node:fs";
import { dirname } from "node:path";
import { fail } from "./errors.ts";
import { errorCode, errorMessage } from "../../util/error.ts";

/** A readable byte source. `size` is fixed once open. */
export interface Backend {
  /** What to name in errors and logs (a path, a URL, `tar:path#member`). */
  readonly name: string;
  /** Size in bytes. */
  readonly size: number;
  /** Read up to `buf.length` bytes at `offset`; returns bytes read (short only at the end). */
  pread(buf: Uint8Array, offset: number): Promise<number>;
  /** Same as `pread` when the source can answer without waiting. */
  preadSync?(buf: Uint8Array, offset: number): number;
  /** Read `length` bytes at `offset` into `buf` at `bufOffset` without a view (hot path). */
  preadSyncAt?(buf: Uint8Array, bufOffset: number, length: number, offset: number): number;
  /** Release what the backend holds. */
  close(): Promise<void>;
}

/** Read exactly `buf.length` bytes at `offset` or throw `overlaybd.truncated`. */
export async function readExact(b: Backend, buf: Uint8Array, offset: number): Promise<void> {
  const n = b.preadSync ? b.preadSync(buf, offset) : await b.pread(buf, offset);
  if (n !== buf.length) fail("truncated", `short read: wanted ${buf.length} bytes, got ${n}`, { file: b.name, offset, wanted: buf.length, got: n });
}

/**
 * A local file opened once and read with positioned reads. Writable when opened with
 * `writable: true` (used for the RW data/index files).
 */
export class LocalFile implements Backend {
  readonly name: string;
  readonly fd: number;
  private _size: number;
  private closed = false;

  private constructor(path: string, fd: number) {
    this.name = path;
    this.fd = fd;
    this._size = fstatSync(fd).size;
  }

  /**
   * Open `path`. `create` makes it (failing if it exists).
   * @throws OverlaybdError `overlaybd.open_failed` with the path and errno code.
   */
  static open(path: string, opts: { writable?: boolean; create?: boolean } = {}): LocalFile {
    let flags = opts.writable ? constants.O_RDWR : constants.O_RDONLY;
    if (opts.create) flags |= constants.O_CREAT | constants.O_EXCL;
    try {
      return new LocalFile(path, openSync(path, flags, 0o644));
    } catch (e) {
      fail("open_failed", `cannot open ${path}: ${errorMessage(e)}`, { file: path, errno: errorCode(e) });
    }
  }

  get size(): number {
    return this._size;
  }

  preadSync(buf: Uint8Array, offset: number): number {
    let done = 0;
    while (done < buf.length) {
      const n = readSync(this.fd, buf, done, buf.length - done, offset + done);
      if (n === 0) break;
      done += n;
    }
    return done;
  }

  preadSyncAt(buf: Uint8Array, bufOffset: number, length: number, offset: number): number {
    let done = 0;
    while (done < length) {
      const n = readSync(this.fd, buf, bufOffset + done, length - done, offset + done);
      if (n === 0) break;
      done += n;
    }
    return done;
  }

  async pread(buf: Uint8Array, offset: number): Promise<number> {
    return this.preadSync(buf, offset);
  }

  /** Write all of `buf` at `offset`, growing the file as needed. */
  pwriteSync(buf: Uint8Array, offset: number): void {
    let done = 0;
    while (done < buf.length) done += writeSync(this.fd, buf, done, buf.length - done, offset + done);
    if (offset + buf.length > this._size) this._size = offset + buf.length;
  }

  /** Cut or extend the file to `length` bytes. */
  truncateSync(length: number): void {
    ftruncateSync(this.fd, length);
    this._size = length;
  }

  /** fsync(2) the file. */
  syncSync(): void {
    fsyncSync(this.fd);
  }

  /** `using f = LocalFile.open(...)` closes the descriptor at scope end. */
  [Symbol.dispose](): void {
    this.closeSync();
  }

  /** Close the descriptor (idempotent). */
  closeSync(): void {
    if (this.closed) return;
    this.closed = true;
    closeSync(this.fd);
  }

  async close(): Promise<void> {
    this.closeSync();
  }
}

/** A window [start, start+length) of another backend, e.g. the payload of a tar member. */
export class SliceBackend implements Backend {
  readonly name: string;
  readonly size: number;
  preadSync?: (buf: Uint8Array, offset: number) => number;

  constructor(readonly inner: Backend, readonly start: number, length: number, name?: string) {
    this.name = name ?? inner.name;
    this.size = length;
    if (inner.preadSync) {
      const sync = inner.preadSync.bind(inner);
      this.preadSync = (buf, offset) => {
        const n = Math.max(0, Math.min(buf.length, this.size - offset));
        return n === 0 ? 0 : sync(n === buf.length ? buf : buf.subarray(0, n), this.start + offset);
      };
    }
  }

  async pread(buf: Uint8Array, offset: number): Promise<number> {
    const n = Math.max(0, Math.min(buf.length, this.size - offset));
    return n === 0 ? 0 : this.inner.pread(n === buf.length ? buf : buf.subarray(0, n), this.start + offset);
  }

  /** Pass a cache eviction through to the inner backend, when it has a cache. */
  evict(offset: number, length: number): void {
    (this.inner as { evict?: (o: number, l: number) => void }).evict?.(this.start + offset, length);
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

/** A backend over bytes in memory (tests, small metadata). */
export class MemoryBackend implements Backend {
  constructor(readonly bytes: Uint8Array, readonly name = "memory") {}
  get size(): number {
    return this.bytes.length;
  }
  preadSync(buf: Uint8Array, offset: number): number {
    const n = Math.max(0, Math.min(buf.length, this.bytes.length - offset));
    if (n > 0) buf.set(this.bytes.subarray(offset, offset + n));
    return n;
  }
  async pread(buf: Uint8Array, offset: number): Promise<number> {
    return this.preadSync(buf, offset);
  }
  async close(): Promise<void> {}
}

/**
 * A new file written under a temporary name (`<path>.partial`) and published under `path` only
 * when complete, so a crash never leaves a half-written layer under its final name. A stale
 * `.partial` from a crashed run is removed on start.
 */
export class AtomicOutput {
  readonly file: LocalFile;
  readonly tmpPath: string;
  private finished = false;

  /** @throws OverlaybdError `open_failed` when `path` already exists or cannot be created */
  constructor(readonly path: string) {
    if (existsSync(path)) fail("open_failed", `cannot create ${path}: it already exists`, { file: path, errno: "EEXIST" });
    this.tmpPath = `${path}.partial`;
    rmSync(this.tmpPath, { force: true });
    this.file = LocalFile.open(this.tmpPath, { writable: true, create: true });
  }

  /** fsync, close, link into place (never replacing an existing file), fsync the folder. */
  publish(): void {
    this.file.syncSync();
    this.file.closeSync();
    try {
      linkSync(this.tmpPath, this.path);
    } catch (e) {
      rmSync(this.tmpPath, { force: true });
      fail("open_failed", `cannot publish ${this.path}: ${errorMessage(e)}`, { file: this.path, errno: errorCode(e) });
    }
    unlinkSync(this.tmpPath);
    const dfd = openSync(dirname(this.path), constants.O_RDONLY);
    try {
      fsyncSync(dfd);
    } finally {
      closeSync(dfd);
    }
    this.finished = true;
  }

  /** Close and remove the temporary file (no-op after publish). */
  abort(): void {
    if (this.finished) return;
    this.finished = true;
    this.file.closeSync();
    rmSync(this.tmpPath, { force: true });
  }
}
