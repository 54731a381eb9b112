/**
 * One FUSE connection serving a filesystem that holds exactly one regular file exposing a
 * BlockImage: the kernel protocol is spoken directly on /dev/fuse (no libfuse). Reads and writes
 * map 1:1 to BlockImage.pread/pwrite, fsync to sync(), fallocate PUNCH_HOLE|KEEP_SIZE (and
 * ZERO_RANGE) to discard(); truncation and growth are refused.
 * Protocol facts: ../shared/docs/fuse-nbd.md §1 (opcodes, INIT flags, error rules).
 *
 * Threads: the process's `FuseReaderPool` reads the requests. With a `DirectPlan` (the image's
 * bytes live in plain files: a raw image via `DirectFileImage`, or a plan the caller built, e.g.
 * from an overlaybd stack's local lower layers) its threads answer READ themselves with pread on
 * those files, and WRITE with pwrite for a raw file; blocks written through the main thread are
 * marked in a shared bitmap before the write starts, and READs touching them come here. Every
 * other request comes here (the main thread), which answers it (a write to /dev/fuse never
 * blocks). READ of an image with synchronous reads (`SyncReadImage`, a local overlaybd stack) is
 * answered inline without a promise, into one reply buffer reused by every request.
 *
 * A connection may start without an image (a pre-created export of a warm pool): the directory
 * is then empty until `bind`.
 */
import { fstatSync, writeSync, writevSync } from "node:fs";
import type { BlockImage } from "../block.ts";
import * as F from "../../ffi/fuse.ts";
import { logger } from "../../observability/log.ts";
import { FuseError } from "./errors.ts";
import { setReadAheadKb } from "./mount.ts";
import { COUNTERS_PER_THREAD, type FuseReaderPool, type PoolClient } from "./reader-pool.ts";
import { EXTENT_FIELDS, type DirectMsg } from "./reader-worker.ts";
import { canReadSync, directFileOf, DIRTY_BLOCK, validate, validateServe, type DirectPlan, type FuseConnectionOptions, type FuseStats, type ServeOptions, type SyncReadImage } from "./serve.ts";
import { errorCode } from "../../util/error.ts";

const log = logger("fuse");
const FILE_INO = 2n;
/** Attribute and entry validity handed to the kernel; the single file never changes shape. */
const ATTR_VALID_SEC = 3600;

/** Offset of READ data in the inline reply buffer: page-aligned (misaligned copies are slow). */
const INLINE_DATA = 4096;
const INLINE_HDR = INLINE_DATA - F.OUT_HEADER_SIZE;

/** One served FUSE connection. */
export class FuseConnection {
  readonly mountPoint: string;
  /** Resolves when the kernel ended the connection (unmount or abort), with the reason. */
  readonly ended: Promise<string>;

  #fd: number;
  #opts: FuseConnectionOptions;
  #serve: ServeOptions | null = null;
  #pool: FuseReaderPool;
  #slot: number;
  #client: PoolClient;
  #closed = false;
  #stats: FuseStats = { reads: 0, writes: 0, bytesRead: 0, bytesWritten: 0, fsyncs: 0, discards: 0, opens: 0, errors: 0, splicedReads: 0 };
  #inflight = new Set<Promise<void>>();
  #writeChain: Promise<void> = Promise.resolve();
  #startTime = Math.floor(Date.now() / 1000);
  /** Shared with the reader threads: [0] closing flag, [1] direct requests in progress. */
  #ctl = new Int32Array(new SharedArrayBuffer(8));
  /** Reader threads' direct-I/O counters. */
  #counters: Float64Array;
  /** Set when READ can be answered inline on this thread (`SyncReadImage`). */
  #syncRead: SyncReadImage | null = null;
  /** Reply buffer of the inline READ path: data at INLINE_DATA, the out header in the 16 bytes before it. */
  #out: Uint8Array = new Uint8Array(0);
  #outView: DataView = new DataView(new ArrayBuffer(0));
  /** Bit per DIRTY_BLOCK: READ there goes to the image (see `DirectPlan.diverted`); null = no tracking. */
  #dirty: Int32Array | null = null;

  /**
   * Serve a mounted connection with the reader threads of `pool`.
   * @throws FuseError `fuse.bad_options`
   */
  constructor(pool: FuseReaderPool, opts: FuseConnectionOptions) {
    validate(opts);
    if (opts.serve) validateServe(opts.serve);
    this.#fd = opts.fd;
    this.#opts = opts;
    this.#pool = pool;
    this.mountPoint = opts.mountPoint;
    this.#counters = new Float64Array(new SharedArrayBuffer(8 * COUNTERS_PER_THREAD * pool.threads));
    let resolveEnded!: (r: string) => void;
    this.ended = new Promise((r) => (resolveEnded = r));
    const direct = opts.serve ? this.#prepare(opts.serve) : null;
    this.#client = {
      onRequest: (req) => {
        if (!this.#readInline(req)) this.#dispatch(req);
      },
      onEnded: (reason) => resolveEnded(reason),
      onDirectFailure: (f) => log.error({ err: f.error, offset: f.offset, size: f.size, mountPoint: this.mountPoint }, `image ${f.op} failed`),
    };
    this.#slot = pool.register(opts.fd, this.#client, direct, this.#ctl, this.#counters);
    if (opts.resume) {
      try {
        writeSync(opts.fd, F.encodeNotify(F.NOTIFY_RESEND));
      } catch (e) {
        // kernels before 6.9 lack RESEND: requests the old server held stay lost (callers get EIO on abort)
        log.warn({ err: e }, "FUSE_NOTIFY_RESEND refused");
      }
    }
  }

  /** Absolute path of the served file (null while nothing is bound). */
  get path(): string | null {
    return this.#serve ? `${this.mountPoint}/${this.#serve.fileName}` : null;
  }

  /** The image being served, if any. */
  get image(): BlockImage | null {
    return this.#serve?.image ?? null;
  }

  /**
   * Start serving `serve` on a connection that serves nothing yet (a warm-pool export).
   * @throws FuseError `fuse.bad_options` (bad options, or an image is bound already), `fuse.closed`
   */
  bind(serve: ServeOptions): void {
    if (this.#closed) throw new FuseError("fuse.closed", "bind on a closed connection", { mountPoint: this.mountPoint });
    if (this.#serve) throw new FuseError("fuse.bad_options", "an image is bound already", { mountPoint: this.mountPoint });
    validateServe(serve);
    this.#pool.update(this.#slot, this.#prepare(serve));
  }

  /**
   * Hand the reader threads a new direct plan for the bound image (after its layers changed,
   * e.g. a restack); ranges written so far stay diverted.
   */
  replan(direct: DirectPlan | null): void {
    const s = this.#serve;
    if (!s || this.#closed) return;
    s.direct = direct ?? undefined;
    this.#pool.update(this.#slot, direct ? this.#directMsg(s.image, direct) : null);
  }

  /**
   * Grow the served image to `newSize` bytes (`BlockImage.grow`) between image mutations, and
   * let the kernel see the new size: the reader threads stop reading this connection (requests
   * wait in the kernel meanwhile), the image grows, the threads come back with a plan of the new
   * size (`direct()`, default: the image's own file), then FUSE_NOTIFY_INVAL_INODE drops the
   * file's cached attributes and the pages from the old end on.
   * @throws FuseError `fuse.closed`, `fuse.bad_options` (no image bound, or it cannot grow); the image's error
   */
  grow(newSize: number, direct?: (img: BlockImage) => DirectPlan | undefined): Promise<void> {
    const s = this.#serve;
    if (this.#closed) return Promise.reject(new FuseError("fuse.closed", "grow on a closed connection", { mountPoint: this.mountPoint }));
    if (!s || !s.image.grow) return Promise.reject(new FuseError("fuse.bad_options", "the connection serves no image that can grow", { mountPoint: this.mountPoint }));
    return this.#serial(async () => {
      const img = s.image;
      const oldSize = img.size;
      await this.#pool.unregister(this.#slot);
      try {
        await img.grow!(newSize);
      } finally {
        // marks so far carry over: those ranges still read through the image
        const old = this.#dirty;
        if (old) {
          this.#dirty = new Int32Array(new SharedArrayBuffer(4 * Math.ceil(img.size / DIRTY_BLOCK / 32 + 1)));
          this.#dirty.set(old.subarray(0, Math.min(old.length, this.#dirty.length)));
        }
        if (direct) s.direct = direct(img);
        const plan = s.direct ?? directFileOf(img);
        this.#slot = this.#pool.register(this.#fd, this.#client, plan ? this.#directMsg(img, plan) : null, this.#ctl, this.#counters);
      }
      if (img.size !== oldSize) {
        try {
          writeSync(this.#fd, F.encodeNotify(F.NOTIFY_INVAL_INODE, F.encodeInvalInode(FILE_INO, Math.floor(oldSize / 4096) * 4096, 0)));
        } catch (e) {
          // ENOENT: the kernel has no inode cached (the file was never looked up): nothing to drop
          if (errorCode(e) !== "ENOENT") throw e;
        }
      }
    });
  }

  #prepare(serve: ServeOptions): DirectMsg | null {
    this.#serve = serve;
    const img = serve.image;
    this.#syncRead = canReadSync(img) ? img : null;
    if (this.#syncRead && this.#out.byteLength === 0) {
      this.#out = new Uint8Array(INLINE_DATA + this.#opts.maxWrite);
      this.#outView = new DataView(this.#out.buffer);
    }
    const plan = serve.direct ?? directFileOf(img);
    return plan ? this.#directMsg(img, plan) : null;
  }

  #directMsg(img: BlockImage, plan: DirectPlan): DirectMsg {
    const writeFd = plan.writeFd ?? -1;
    // writes that go through the image change what reads must return: track them
    if (writeFd < 0 && (!img.readOnly || plan.diverted.length > 0) && !this.#dirty) {
      this.#dirty = new Int32Array(new SharedArrayBuffer(4 * Math.ceil(img.size / DIRTY_BLOCK / 32 + 1)));
    }
    for (const [a, b] of plan.diverted) this.#divert(a, b - a);
    // each extent's file size, so reader threads know which ranges a file holds whole (splice)
    const sizes = new Map<number, number>();
    const fileSize = (fd: number) => sizes.get(fd) ?? sizes.set(fd, fstatSync(fd).size).get(fd)!;
    const ext = new Float64Array(plan.extents.length * EXTENT_FIELDS);
    plan.extents.forEach((e, i) => ext.set([e.offset, e.length, e.fd, e.fileOffset, fileSize(e.fd)], i * EXTENT_FIELDS));
    return { size: img.size, ext, writeFd, zeroFill: plan.zeroFill, dirty: writeFd < 0 ? this.#dirty : null };
  }

  /**
   * Stop serving: the reader threads stop reading this fd, in-flight requests finish, then the
   * image is synced and closed. The mount and the fd belong to the caller. Idempotent.
   * @throws FuseError `fuse.internal` if a reader thread still serves it (a bug; the image stays open)
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    // reader threads stop serving directly (later requests come here) and finish the ones
    // they started before the image's files are closed
    Atomics.store(this.#ctl, 0, 1);
    await this.#pool.unregister(this.#slot);
    // every reader thread acknowledged the removal between two of its batches, and a direct
    // request is served within one synchronous batch, so none is in progress now (grow relies on
    // the same). Were one, closing the files would answer it from a closed or reused fd: keep
    // them open and fail instead.
    const busy = Atomics.load(this.#ctl, 1);
    if (busy !== 0) throw new FuseError("fuse.internal", `${busy} direct requests still in progress on ${this.mountPoint} after every reader thread released it`, { mountPoint: this.mountPoint, busy });
    await Promise.allSettled([...this.#inflight]);
    log.debug({ mountPoint: this.mountPoint, ...this.stats }, "fuse connection closing");
    const img = this.#serve?.image;
    if (!img) return;
    try {
      if (!img.readOnly) await img.sync();
    } finally {
      await img.close();
    }
  }

  /** Counters of served requests (this thread's and the reader threads' direct ones). */
  get stats(): FuseStats {
    const s = { ...this.#stats };
    const c = this.#counters;
    for (let i = 0; i < c.length; i += COUNTERS_PER_THREAD) {
      s.reads += c[i]!;
      s.bytesRead += c[i + 1]!;
      s.writes += c[i + 2]!;
      s.bytesWritten += c[i + 3]!;
      s.errors += c[i + 4]!;
      s.splicedReads += c[i + 5]!;
    }
    return s;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /**
   * Run image mutations one at a time, in arrival order: an unaligned write is a
   * read-modify-write across awaits, and two overlapping ones must not interleave. (The kernel
   * already holds the inode lock around a direct write, but async direct I/O and page-cache
   * writeback can still have several WRITEs of one file in flight.)
   */
  #serial<T>(op: () => Promise<T>): Promise<T> {
    const run = this.#writeChain.then(op);
    this.#writeChain = run.then(() => undefined, () => undefined);
    return run;
  }

  /**
   * Run `op` between image mutations (e.g. a restack, which swaps the upper): no WRITE, discard
   * or fsync runs meanwhile.
   */
  exclusive<T>(op: () => Promise<T>): Promise<T> {
    return this.#serial(op);
  }

  /** Send later READs of [offset, offset+length) to the image (before a write there starts). */
  #divert(offset: number, length: number): void {
    const d = this.#dirty;
    if (!d || length <= 0) return;
    const last = Math.min(Math.floor((offset + length - 1) / DIRTY_BLOCK), d.length * 32 - 1);
    for (let b = Math.floor(offset / DIRTY_BLOCK); b <= last;) {
      if ((b & 31) === 0 && b + 31 <= last) {
        Atomics.store(d, b >>> 5, -1); // a whole word of 32 blocks
        b += 32;
      } else {
        Atomics.or(d, b >>> 5, 1 << (b & 31));
        b++;
      }
    }
  }

  #dispatch(req: Uint8Array): void {
    const p = this.#handle(req).catch((e) => log.error({ err: e }, "fuse request handler failed"));
    this.#inflight.add(p);
    void p.finally(() => this.#inflight.delete(p));
  }

  /**
   * Answer a READ of the file inline when the image reads synchronously: data read straight into
   * the reused reply buffer after its header, one write(2). Same replies as the READ case of
   * `#handle`. Returns false for any other request (handled by `#handle`).
   */
  #readInline(req: Uint8Array): boolean {
    const img = this.#syncRead;
    if (!img || this.#closed || req.byteLength < F.IN_HEADER_SIZE + 24) return false;
    const v = new DataView(req.buffer, req.byteOffset, req.byteLength);
    if (v.getUint32(4, true) !== F.Op.READ || v.getBigUint64(16, true) !== FILE_INO) return false;
    const r = F.decodeRwIn(req.subarray(F.IN_HEADER_SIZE));
    const unique = v.getBigUint64(8, true);
    const len = Math.max(0, Math.min(r.size, img.size - r.offset, this.#out.byteLength - INLINE_DATA));
    if (len === 0) {
      this.#reply(unique, 0, new Uint8Array(0));
      return true;
    }
    let n: number;
    try {
      n = img.preadSync(this.#out.subarray(INLINE_DATA, INLINE_DATA + len), r.offset);
    } catch (e) {
      log.error({ err: e, offset: r.offset, size: r.size }, "image read failed");
      this.#reply(unique, F.Errno.EIO);
      return true;
    }
    this.#stats.reads++;
    this.#stats.bytesRead += n;
    const o = this.#outView;
    o.setUint32(INLINE_HDR, F.OUT_HEADER_SIZE + n, true);
    o.setInt32(INLINE_HDR + 4, 0, true);
    o.setBigUint64(INLINE_HDR + 8, unique, true);
    try {
      writeSync(this.#fd, this.#out, INLINE_HDR, F.OUT_HEADER_SIZE + n);
    } catch (e) {
      const code = errorCode(e);
      if (code !== "ENOENT" && code !== "ENODEV" && code !== "ECONNABORTED") log.warn({ err: e }, "fuse reply failed");
    }
    return true;
  }

  #reply(unique: bigint, error: number, body?: Uint8Array): void {
    if (error) this.#stats.errors++;
    try {
      if (error === 0 && body && body.byteLength > 4096) {
        // large payloads (READ data): header and body in one writev, without copying the body
        writevSync(this.#fd, [F.encodeReply(unique, 0, undefined, body.byteLength), body]);
      } else {
        writeSync(this.#fd, F.encodeReply(unique, error, body));
      }
    } catch (e) {
      // ENOENT: the request was interrupted or the connection aborted meanwhile.
      const code = errorCode(e);
      if (code !== "ENOENT" && code !== "ENODEV" && code !== "ECONNABORTED") log.warn({ err: e }, "fuse reply failed");
    }
  }

  #attr(ino: bigint, img: BlockImage): F.Attr {
    if (ino === F.ROOT_ID) return { ino, size: 0, mode: F.S_IFDIR | 0o755, nlink: 2, uid: 0, gid: 0, time: this.#startTime };
    const mode = img.readOnly && !this.#serve?.acceptWritableOpen ? 0o444 : 0o644;
    return { ino, size: img.size, mode: F.S_IFREG | mode, nlink: 1, uid: 0, gid: 0, time: this.#startTime };
  }

  async #handle(req: Uint8Array): Promise<void> {
    if (req.byteLength < F.IN_HEADER_SIZE) return;
    const h = F.decodeInHeader(req);
    const body = req.subarray(F.IN_HEADER_SIZE, h.len);
    const serve = this.#serve;
    const img = serve?.image;
    // without an image the directory is empty and node 2 does not exist
    const known = h.nodeid === F.ROOT_ID || (h.nodeid === FILE_INO && img !== undefined);
    switch (h.opcode) {
      case F.Op.INIT: {
        const k = F.decodeInitIn(body);
        if (k.major !== F.KERNEL_MAJOR) return this.#reply(h.unique, F.Errno.EPROTO);
        const want = F.InitFlag.ASYNC_READ | F.InitFlag.BIG_WRITES | F.InitFlag.ASYNC_DIO | F.InitFlag.PARALLEL_DIROPS |
          F.InitFlag.ABORT_ERROR | F.InitFlag.MAX_PAGES | F.InitFlag.INIT_EXT;
        const minor = Math.min(k.minor, F.KERNEL_MINOR);
        const timeout = this.#opts.requestTimeoutSec > 0 && minor >= 43 && (k.flags2 & F.InitFlag2.REQUEST_TIMEOUT) !== 0;
        const out = F.encodeInitOut({
          major: F.KERNEL_MAJOR, minor, maxReadahead: k.maxReadahead, flags: (want & k.flags) >>> 0,
          flags2: timeout ? F.InitFlag2.REQUEST_TIMEOUT : 0, maxBackground: 64, congestionThreshold: 48,
          maxWrite: this.#opts.maxWrite, maxPages: this.#opts.maxWrite / 4096,
          requestTimeout: timeout ? this.#opts.requestTimeoutSec : 0,
        });
        this.#reply(h.unique, 0, out);
        // the kernel set the mount's readahead while taking the reply: raise it now
        const kb = this.#opts.readAheadKb ?? 0;
        const why = kb > 0 ? setReadAheadKb(this.mountPoint, kb) : null;
        if (why) log.warn({ mountPoint: this.mountPoint, readAheadKb: kb, why }, "FUSE readahead left at the kernel's");
        return;
      }
      case F.Op.FORGET:
      case F.Op.BATCH_FORGET:
      case F.Op.INTERRUPT:
        return; // never answered
      case F.Op.DESTROY:
        return this.#reply(h.unique, 0);
      case F.Op.LOOKUP: {
        if (h.nodeid !== F.ROOT_ID) return this.#reply(h.unique, F.Errno.ENOTDIR);
        if (!img || F.decodeName(body) !== serve.fileName) return this.#reply(h.unique, F.Errno.ENOENT);
        return this.#reply(h.unique, 0, F.encodeEntryOut(this.#attr(FILE_INO, img), ATTR_VALID_SEC));
      }
      case F.Op.GETATTR:
        if (!known) return this.#reply(h.unique, F.Errno.ENOENT);
        return this.#reply(h.unique, 0, F.encodeAttrOut(this.#attr(h.nodeid, img!), ATTR_VALID_SEC));
      case F.Op.SETATTR: {
        if (!known) return this.#reply(h.unique, F.Errno.ENOENT);
        const s = F.decodeSetattrIn(body);
        if ((s.valid & F.FATTR_SIZE) !== 0 && (h.nodeid !== FILE_INO || s.size !== img!.size)) return this.#reply(h.unique, F.Errno.EPERM);
        return this.#reply(h.unique, 0, F.encodeAttrOut(this.#attr(h.nodeid, img!), ATTR_VALID_SEC));
      }
      case F.Op.OPEN: {
        if (h.nodeid !== FILE_INO || !img) return this.#reply(h.unique, h.nodeid === F.ROOT_ID ? F.Errno.EISDIR : F.Errno.ENOENT);
        const flags = F.decodeOpenFlags(body);
        if (img.readOnly && !serve.acceptWritableOpen && (flags & F.O_ACCMODE) !== F.O_RDONLY) return this.#reply(h.unique, F.Errno.EROFS);
        this.#stats.opens++;
        const openFlags = (serve.directIo ? F.FOPEN_DIRECT_IO : 0) | (img.readOnly ? F.FOPEN_KEEP_CACHE : 0);
        return this.#reply(h.unique, 0, F.encodeOpenOut(0n, openFlags));
      }
      case F.Op.OPENDIR:
        if (h.nodeid !== F.ROOT_ID) return this.#reply(h.unique, F.Errno.ENOTDIR);
        return this.#reply(h.unique, 0, F.encodeOpenOut(0n, 0));
      case F.Op.READDIR: {
        if (h.nodeid !== F.ROOT_ID) return this.#reply(h.unique, F.Errno.ENOTDIR);
        const r = F.decodeRwIn(body);
        const entries: F.Dirent[] = [
          { ino: F.ROOT_ID, name: ".", type: F.DT_DIR },
          { ino: F.ROOT_ID, name: "..", type: F.DT_DIR },
          ...(img ? [{ ino: FILE_INO, name: serve.fileName, type: F.DT_REG }] : []),
        ];
        return this.#reply(h.unique, 0, F.encodeDirents(entries, r.offset, r.size));
      }
      case F.Op.READ: {
        if (h.nodeid !== FILE_INO || !img) return this.#reply(h.unique, F.Errno.EISDIR);
        const r = F.decodeRwIn(body);
        const len = Math.max(0, Math.min(r.size, img.size - r.offset));
        if (len === 0) return this.#reply(h.unique, 0, new Uint8Array(0));
        const buf = new Uint8Array(len);
        try {
          const n = await img.pread(buf, r.offset);
          this.#stats.reads++;
          this.#stats.bytesRead += n;
          return this.#reply(h.unique, 0, buf.subarray(0, n));
        } catch (e) {
          log.error({ err: e, offset: r.offset, size: r.size }, "image read failed");
          return this.#reply(h.unique, F.Errno.EIO);
        }
      }
      case F.Op.WRITE: {
        if (h.nodeid !== FILE_INO || !img) return this.#reply(h.unique, F.Errno.EISDIR);
        if (img.readOnly) return this.#reply(h.unique, F.Errno.EROFS);
        const w = F.decodeRwIn(body);
        const data = body.subarray(F.WRITE_IN_SIZE, F.WRITE_IN_SIZE + w.size);
        if (data.byteLength !== w.size) return this.#reply(h.unique, F.Errno.EINVAL);
        if (w.offset + w.size > img.size) return this.#reply(h.unique, F.Errno.ENOSPC);
        this.#divert(w.offset, w.size);
        try {
          const n = await this.#serial(() => img.pwrite(data, w.offset));
          this.#stats.writes++;
          this.#stats.bytesWritten += n;
          return this.#reply(h.unique, 0, F.encodeWriteOut(n));
        } catch (e) {
          log.error({ err: e, offset: w.offset, size: w.size }, "image write failed");
          return this.#reply(h.unique, F.Errno.EIO);
        }
      }
      case F.Op.FALLOCATE: {
        if (h.nodeid !== FILE_INO || !img) return this.#reply(h.unique, F.Errno.EISDIR);
        const a = F.decodeFallocateIn(body);
        const punch = a.mode === (F.FALLOC_FL_PUNCH_HOLE | F.FALLOC_FL_KEEP_SIZE);
        if (img.readOnly) {
          // a private mapper's discard hint (ServeOptions.acceptWritableOpen): nothing changes
          if (!punch || !this.#serve?.acceptWritableOpen) return this.#reply(h.unique, F.Errno.EROFS);
          if (a.offset + a.length > img.size) return this.#reply(h.unique, F.Errno.EINVAL);
          this.#stats.discards++;
          return this.#reply(h.unique, 0);
        }
        if (a.offset + a.length > img.size) return this.#reply(h.unique, F.Errno.ENOSPC);
        const zero = (a.mode & ~F.FALLOC_FL_KEEP_SIZE) === F.FALLOC_FL_ZERO_RANGE;
        if (a.mode === 0 || a.mode === F.FALLOC_FL_KEEP_SIZE) return this.#reply(h.unique, 0); // preallocation inside the size: nothing to do
        if (!punch && !zero) return this.#reply(h.unique, F.Errno.EOPNOTSUPP);
        this.#divert(a.offset, a.length);
        try {
          await this.#serial(() => img.discard(a.offset, a.length));
          this.#stats.discards++;
          return this.#reply(h.unique, 0);
        } catch (e) {
          log.error({ err: e, offset: a.offset, length: a.length }, "image discard failed");
          return this.#reply(h.unique, F.Errno.EIO);
        }
      }
      case F.Op.FSYNC: {
        if (!img) return this.#reply(h.unique, 0);
        try {
          if (!img.readOnly) await this.#serial(() => img.sync());
          this.#stats.fsyncs++;
          return this.#reply(h.unique, 0);
        } catch (e) {
          log.error({ err: e }, "image sync failed");
          return this.#reply(h.unique, F.Errno.EIO);
        }
      }
      case F.Op.FLUSH:
      case F.Op.RELEASE:
      case F.Op.RELEASEDIR:
      case F.Op.FSYNCDIR:
        return this.#reply(h.unique, 0);
      case F.Op.STATFS:
        return this.#reply(h.unique, 0, F.encodeStatfsOut(Math.ceil((img?.size ?? 0) / 4096), 4096, 2));
      case F.Op.CREATE:
        return this.#reply(h.unique, F.Errno.EPERM);
      default:
        return this.#reply(h.unique, F.Errno.ENOSYS);
    }
  }
}
