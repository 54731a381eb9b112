/**
 * io_uring from raw system calls (no liburing): ring setup with any setup flags (64- or 128-byte
 * SQEs), SQE preparation for the operations this project uses (READ, WRITE, FSYNC, NOP,
 * URING_CMD), submission, blocking waits and CQE reaping; plus `readBatch`, a synchronous batch
 * of positioned reads. Not thread-safe: one ring belongs to one thread (a ublk queue ring to its
 * Worker, see src/storage/ublk/).
 *
 * Layouts and numbers from include/uapi/linux/io_uring.h (checked against linux-source-6.1), see
 * ../shared/docs/ublk-iouring-firecracker.md §2: io_uring_setup 425 / io_uring_enter 426 /
 * io_uring_register 427 (x86_64); io_uring_params 120 bytes (sq_off @40, cq_off @80); SQE 64
 * bytes (128 with IORING_SETUP_SQE128; the URING_CMD payload starts at SQE byte 48); CQE 16
 * bytes; mmap offsets SQ_RING 0, CQ_RING 0x8000000, SQES 0x10000000.
 */
import { ptr, read, toArrayBuffer, type Pointer } from "bun:ffi";
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc, mapFailed } from "./libc.ts";

const SYS_io_uring_setup = 425;
const SYS_io_uring_enter = 426;
const SYS_io_uring_register = 427;

/** Opcodes (enum io_uring_op). */
export const IORING_OP = { NOP: 0, FSYNC: 3, FALLOCATE: 17, READ: 22, WRITE: 23, URING_CMD: 46 } as const;
/** Setup flags (io_uring_params.flags). */
export const IORING_SETUP = {
  CQSIZE: 1 << 3,
  CLAMP: 1 << 4,
  SUBMIT_ALL: 1 << 7,
  COOP_TASKRUN: 1 << 8,
  TASKRUN_FLAG: 1 << 9,
  SQE128: 1 << 10,
  SINGLE_ISSUER: 1 << 12,
  DEFER_TASKRUN: 1 << 13,
} as const;
/**
 * SQE flags (io_uring_sqe.flags, byte 1): IO_LINK: the next SQE starts once this one completed
 * in full (a failure or a short transfer cancels the rest of the chain with -ECANCELED);
 * CQE_SKIP_SUCCESS (5.17): post no CQE when it succeeds; when it fails, its CQE is posted and the
 * CQEs of the chain members it cancels are suppressed (REQ_F_SKIP_LINK_CQES).
 */
export const IOSQE = { IO_LINK: 1 << 2, CQE_SKIP_SUCCESS: 1 << 6 } as const;
/** io_uring_enter flags. */
export const IORING_ENTER_GETEVENTS = 1;
/** fsync_flags: fdatasync instead of fsync. */
export const IORING_FSYNC_DATASYNC = 1;
/** io_uring_register opcode: signal an eventfd on every posted CQE. */
const IORING_REGISTER_EVENTFD = 4;
const IORING_FEAT_SINGLE_MMAP = 1;
const IORING_OFF_SQ_RING = 0;
const IORING_OFF_CQ_RING = 0x8000000;
const IORING_OFF_SQES = 0x10000000;
const PROT_RW = 0x1 | 0x2;
const MAP_SHARED_POPULATE = 0x01 | 0x8000;
const EINTR = 4;
const EINVAL = 22;

/** io_uring_params field offsets (bytes). */
export const PARAMS = { SIZE: 120, SQ_ENTRIES: 0, CQ_ENTRIES: 4, FLAGS: 8, FEATURES: 20, SQ_OFF: 40, CQ_OFF: 80 } as const;
/** io_sqring_offsets / io_cqring_offsets member offsets (bytes, relative to sq_off / cq_off). */
const SQ_HEAD = 0, SQ_TAIL = 4, SQ_MASK = 8, SQ_ARRAY = 24;
const CQ_HEAD = 0, CQ_TAIL = 4, CQ_MASK = 8, CQ_CQES = 20;
/** io_uring_sqe field offsets (bytes). */
export const SQE = {
  SIZE: 64,
  SIZE128: 128,
  OPCODE: 0,
  FLAGS: 1,
  FD: 4,
  OFF: 8,
  /** URING_CMD: cmd_op u32 (in the `off` union). */
  CMD_OP: 8,
  ADDR: 16,
  LEN: 24,
  /** rw_flags / fsync_flags / uring_cmd_flags union. */
  OP_FLAGS: 28,
  USER_DATA: 32,
  /** URING_CMD payload (16 bytes in a 64-byte SQE, 80 with SQE128). */
  CMD: 48,
} as const;
/** io_uring_cqe: user_data u64 @0, res s32 @8, flags u32 @12. */
export const CQE = { SIZE: 16, USER_DATA: 0, RES: 8, FLAGS: 12 } as const;



/** A failed io_uring system call or operation; `errno` is the raw (positive) number. */
export class IoUringError extends AgentEnvError<FfiCodes<"io_uring">> {
  constructor(
    readonly call: string,
    readonly errno: number,
  ) {
    super("io_uring.failed", `${call} failed: errno ${errno}`, { call, errno });
  }
}

/** One read of a batch: fill `buf[bufOffset, bufOffset+length)` from file byte `offset` (of `fd` when set, else the batch's fd). */
export interface ReadRequest {
  fd?: number;
  buf: Uint8Array;
  bufOffset: number;
  length: number;
  offset: number;
}

/** How to set up a ring. */
export interface IoUringOptions {
  /** SQ entries (the kernel rounds up to a power of two). */
  entries: number;
  /** CQ entries (IORING_SETUP_CQSIZE); default twice the SQ. */
  cqEntries?: number;
  /** IORING_SETUP_* flags (SQE128, SINGLE_ISSUER, DEFER_TASKRUN, COOP_TASKRUN, ...). */
  flags?: number;
}

/** Fields of one SQE, as written by `prep`. 64-bit fields are JS numbers (addresses and offsets stay below 2^53). */
export interface SqeFields {
  opcode: number;
  fd: number;
  /** File offset in bytes (READ/WRITE), or 0. */
  off?: number;
  /** Buffer address (READ/WRITE), or 0. */
  addr?: number;
  /** Buffer length in bytes, or 0. */
  len?: number;
  /** rw_flags / fsync_flags / uring_cmd_flags. */
  opFlags?: number;
  /** IOSQE_* flags (byte 1). */
  sqeFlags?: number;
  /** Returned in the CQE (up to 2^53). */
  userData: number;
}

const TWO32 = 2 ** 32;

/** Write a u64 held in a JS number (< 2^53) as two little-endian u32 words. */
function setU64(w: Uint32Array, word: number, v: number): void {
  w[word] = v % TWO32;
  w[word + 1] = Math.floor(v / TWO32);
}

/**
 * An io_uring instance. Prepare SQEs with `prep`/`prepUringCmd` (they are queued locally), hand
 * them to the kernel with `submit` (optionally waiting for completions), read completions with
 * `reap`. The rings live in kernel-shared mappings until `close()`.
 * @throws IoUringError when setup or mmap fails (e.g. io_uring disabled by sysctl/seccomp, an
 * unknown setup flag: EINVAL)
 */
export class IoUring {
  readonly fd: number;
  /** SQ entries after rounding. */
  readonly entries: number;
  /** CQ entries after rounding. */
  readonly cqEntries: number;
  /** Setup flags the ring was created with. */
  readonly flags: number;
  /** IORING_FEAT_* bits the kernel reported. */
  readonly features: number;
  /** SQE size in bytes: 64, or 128 with IORING_SETUP_SQE128. */
  readonly sqeSize: number;
  /** The SQE array as 32-bit words (SQE `i` starts at word `i * sqeSize / 4`). */
  readonly sqeWords: Uint32Array;
  private readonly maps: Array<[Pointer, number]> = [];
  private readonly sq: Uint32Array;
  private readonly cq: Uint32Array;
  private readonly cqes: DataView;
  private readonly sqHead: number; // indexes into the Uint32Array views
  private readonly sqTail: number;
  private readonly sqMask: number;
  private readonly cqHead: number;
  private readonly cqTail: number;
  private readonly cqMask: number;
  /** Local SQ tail: SQEs up to here are prepared; the shared tail is published by `submit`. */
  private tail = 0;
  private closed = false;

  constructor(opts: number | IoUringOptions = 64) {
    const o: IoUringOptions = typeof opts === "number" ? { entries: opts } : opts;
    let flags = o.flags ?? 0;
    if (o.cqEntries !== undefined) flags |= IORING_SETUP.CQSIZE;
    const params = new Uint8Array(PARAMS.SIZE);
    const dv = new DataView(params.buffer);
    dv.setUint32(PARAMS.FLAGS, flags, true);
    if (o.cqEntries !== undefined) dv.setUint32(PARAMS.CQ_ENTRIES, o.cqEntries, true);
    const fd = Number(libc().syscall(SYS_io_uring_setup, o.entries, ptr(params), 0, 0, 0, 0));
    if (fd < 0) throw new IoUringError("io_uring_setup", errno());
    this.fd = fd;
    this.flags = flags;
    this.sqeSize = flags & IORING_SETUP.SQE128 ? SQE.SIZE128 : SQE.SIZE;
    const sqEntries = dv.getUint32(PARAMS.SQ_ENTRIES, true), cqEntries = dv.getUint32(PARAMS.CQ_ENTRIES, true);
    this.entries = sqEntries;
    this.cqEntries = cqEntries;
    this.features = dv.getUint32(PARAMS.FEATURES, true);
    const so = (k: number) => dv.getUint32(PARAMS.SQ_OFF + k, true);
    const co = (k: number) => dv.getUint32(PARAMS.CQ_OFF + k, true);
    const sqLen = so(SQ_ARRAY) + sqEntries * 4;
    const cqLen = co(CQ_CQES) + cqEntries * CQE.SIZE;
    const single = (this.features & IORING_FEAT_SINGLE_MMAP) !== 0;
    try {
      const ringLen = single ? Math.max(sqLen, cqLen) : sqLen;
      const sqPtr = this.map(ringLen, IORING_OFF_SQ_RING);
      const cqPtr = single ? sqPtr : this.map(cqLen, IORING_OFF_CQ_RING);
      const sqeLen = sqEntries * this.sqeSize;
      const sqePtr = this.map(sqeLen, IORING_OFF_SQES);
      const sqBuf = toArrayBuffer(sqPtr, 0, ringLen);
      const cqBuf = single ? sqBuf : toArrayBuffer(cqPtr, 0, cqLen);
      this.sq = new Uint32Array(sqBuf);
      this.cq = new Uint32Array(cqBuf);
      this.sqeWords = new Uint32Array(toArrayBuffer(sqePtr, 0, sqeLen));
      this.cqes = new DataView(cqBuf, co(CQ_CQES), cqEntries * CQE.SIZE);
      this.sqHead = so(SQ_HEAD) / 4;
      this.sqTail = so(SQ_TAIL) / 4;
      this.sqMask = this.sq[so(SQ_MASK) / 4]!;
      this.cqHead = co(CQ_HEAD) / 4;
      this.cqTail = co(CQ_TAIL) / 4;
      this.cqMask = this.cq[co(CQ_MASK) / 4]!;
      const arr = so(SQ_ARRAY) / 4;
      for (let i = 0; i < sqEntries; i++) this.sq[arr + i] = i;
      this.tail = Atomics.load(this.sq, this.sqTail);
    } catch (e) {
      this.close();
      throw e;
    }
  }

  private map(len: number, off: number): Pointer {
    const p = libc().mmap(null, len, PROT_RW, MAP_SHARED_POPULATE, this.fd, off) as Pointer | null;
    if (mapFailed(p)) throw new IoUringError("mmap", errno());
    this.maps.push([p, len]);
    return p;
  }

  /** SQEs prepared and not yet consumed by the kernel. */
  get pending(): number {
    return (this.tail - Atomics.load(this.sq, this.sqHead)) >>> 0;
  }

  /** SQE slots free now (prepare at most this many without an implicit submit). */
  get space(): number {
    return this.entries - this.pending;
  }

  /**
   * Claim the next SQE slot, zeroed; returns its first word index in `sqeWords`. When the SQ is
   * full, the prepared SQEs are submitted first (without waiting).
   * @throws IoUringError `EBUSY`-like (errno 16) when the kernel consumes none of a full SQ
   */
  nextSqe(): number {
    if (this.pending >= this.entries) {
      this.submit(0);
      if (this.pending >= this.entries) throw new IoUringError("sq full", 16);
    }
    const words = this.sqeSize >>> 2;
    const o = (this.tail & this.sqMask) * words;
    this.sqeWords.fill(0, o, o + words);
    this.tail = (this.tail + 1) >>> 0;
    return o;
  }

  /** Prepare one SQE from `f`; returns its first word index (e.g. to add a URING_CMD payload). */
  prep(f: SqeFields): number {
    const w = this.sqeWords;
    const o = this.nextSqe();
    w[o] = f.opcode | ((f.sqeFlags ?? 0) << 8); // opcode byte 0, flags byte 1; ioprio 0
    w[o + (SQE.FD >>> 2)] = f.fd;
    if (f.off) setU64(w, o + (SQE.OFF >>> 2), f.off);
    if (f.addr) setU64(w, o + (SQE.ADDR >>> 2), f.addr);
    if (f.len) w[o + (SQE.LEN >>> 2)] = f.len;
    if (f.opFlags) w[o + (SQE.OP_FLAGS >>> 2)] = f.opFlags;
    setU64(w, o + (SQE.USER_DATA >>> 2), f.userData);
    return o;
  }

  /**
   * `prep` with positional fields, allocating nothing: for a hot loop (a ublk queue thread
   * prepares a few SQEs per request).
   * @returns the SQE's first word index
   */
  prepFields(opcode: number, fd: number, off: number, addr: number, len: number, userData: number, sqeFlags = 0, opFlags = 0): number {
    const w = this.sqeWords;
    const o = this.nextSqe();
    w[o] = opcode | (sqeFlags << 8);
    w[o + (SQE.FD >>> 2)] = fd;
    if (off) setU64(w, o + (SQE.OFF >>> 2), off);
    if (addr) setU64(w, o + (SQE.ADDR >>> 2), addr);
    if (len) w[o + (SQE.LEN >>> 2)] = len;
    if (opFlags) w[o + (SQE.OP_FLAGS >>> 2)] = opFlags;
    setU64(w, o + (SQE.USER_DATA >>> 2), userData);
    return o;
  }

  /**
   * Prepare an IORING_OP_URING_CMD SQE on `fd` with command `cmdOp`; the caller writes the payload
   * at word `returned + SQE.CMD / 4` (16 bytes, or 80 with SQE128).
   */
  prepUringCmd(fd: number, cmdOp: number, userData: number, sqeFlags = 0): number {
    const o = this.prepFields(IORING_OP.URING_CMD, fd, 0, 0, 0, userData, sqeFlags);
    this.sqeWords[o + (SQE.CMD_OP >>> 2)] = cmdOp >>> 0;
    return o;
  }

  /**
   * io_uring_enter(2): submit `toSubmit` SQEs and, with GETEVENTS in `flags`, wait for
   * `minComplete` completions. EINTR is returned as -EINTR (no throw) so loops can retry.
   * @returns SQEs consumed, or -EINTR
   * @throws IoUringError for any other failure
   */
  enter(toSubmit: number, minComplete: number, flags: number): number {
    const n = Number(libc().syscall(SYS_io_uring_enter, this.fd, toSubmit, minComplete, flags, 0, 0));
    if (n >= 0) return n;
    const e = errno();
    if (e === EINTR) return -EINTR;
    throw new IoUringError("io_uring_enter", e);
  }

  /**
   * Publish the prepared SQEs and enter the kernel once: submit them all and, when
   * `waitFor` > 0, block until at least that many completions are posted (or a signal arrives).
   * @returns SQEs the kernel consumed in this call
   * @throws IoUringError from io_uring_enter (not EINTR)
   */
  submit(waitFor = 0): number {
    Atomics.store(this.sq, this.sqTail, this.tail);
    const n = this.pending;
    if (n === 0 && waitFor === 0) return 0;
    const r = this.enter(n, waitFor, waitFor > 0 ? IORING_ENTER_GETEVENTS : 0);
    return r < 0 ? 0 : r;
  }

  /**
   * Hand every posted CQE to `fn` (user_data, res, flags) and release them to the kernel.
   * @returns how many were reaped
   */
  reap(fn: (userData: number, res: number, flags: number) => void): number {
    let head = Atomics.load(this.cq, this.cqHead);
    const ctail = Atomics.load(this.cq, this.cqTail);
    let n = 0;
    const c = this.cqes;
    while (head !== ctail) {
      const o = (head & this.cqMask) * CQE.SIZE;
      const ud = c.getUint32(o, true) + c.getUint32(o + 4, true) * TWO32;
      const res = c.getInt32(o + CQE.RES, true);
      const fl = c.getUint32(o + CQE.FLAGS, true);
      head = (head + 1) >>> 0;
      // release before the callback: it may submit and wait again
      Atomics.store(this.cq, this.cqHead, head);
      fn(ud, res, fl);
      n++;
    }
    return n;
  }

  /**
   * Signal `eventFd` whenever a CQE is posted (IORING_REGISTER_EVENTFD), so another thread or
   * the event loop can wait for completions without entering the ring.
   * @throws IoUringError from io_uring_register
   */
  registerEventfd(eventFd: number): void {
    const arg = new Int32Array([eventFd]);
    const r = Number(libc().syscall(SYS_io_uring_register, this.fd, IORING_REGISTER_EVENTFD, ptr(arg), 1, 0, 0));
    if (r < 0) throw new IoUringError("io_uring_register(EVENTFD)", errno());
  }

  /**
   * Submit every read (on `fd`, or each request's own `fd`), wait for all completions. The buffers are referenced by address during
   * the call only; no JS runs until the kernel is done with them.
   * @returns bytes read per request (short at end of file)
   * @throws IoUringError on a failed enter or a read that failed (negative res)
   */
  readBatch(fd: number, reqs: readonly ReadRequest[], out: number[] = []): number[] {
    if (reqs.length > this.entries) throw new IoUringError(`batch of ${reqs.length} > ${this.entries} entries`, EINVAL);
    if (this.pending > 0) throw new IoUringError("readBatch with SQEs already prepared", EINVAL);
    for (let i = 0; i < reqs.length; i++) {
      const r = reqs[i]!;
      this.prep({ opcode: IORING_OP.READ, fd: r.fd ?? fd, off: r.offset, addr: ptr(r.buf, r.bufOffset) as number, len: r.length, userData: i });
    }
    let want = reqs.length, failed = 0;
    out.length = reqs.length;
    while (want > 0) {
      this.submit(want);
      // keep reaping after a failure so no stale CQE is left behind
      want -= this.reap((ud, res) => {
        if (res < 0 && failed === 0) failed = -res;
        out[ud] = res;
      });
    }
    if (failed) throw new IoUringError("read", failed);
    return out;
  }

  /** Unmap the rings and close the ring fd (idempotent). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const [p, len] of this.maps) libc().munmap(p, len);
    libc().close(this.fd);
  }
}
