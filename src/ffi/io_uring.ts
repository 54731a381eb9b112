/**
 * A minimal io_uring for batched positioned reads, driven synchronously from the calling thread
 * (submit N reads, wait for N completions in one io_uring_enter). Layouts and numbers from
 * include/uapi/linux/io_uring.h (see shared/docs/ublk-iouring-firecracker.md section 2):
 * io_uring_setup 425 / io_uring_enter 426 (x86_64), io_uring_params 120 bytes, SQE 64 bytes,
 * CQE 16 bytes, IORING_OP_READ 22, IORING_ENTER_GETEVENTS 1, IORING_FEAT_SINGLE_MMAP 1,
 * mmap offsets SQ_RING 0, CQ_RING 0x8000000, SQES 0x10000000.
 */
import { dlopen, FFIType, ptr, read, toArrayBuffer, type Pointer } from "bun:ffi";

const SYS_io_uring_setup = 425;
const SYS_io_uring_enter = 426;
const IORING_OP_READ = 22;
const IORING_ENTER_GETEVENTS = 1;
const IORING_FEAT_SINGLE_MMAP = 1;
const IORING_OFF_SQ_RING = 0;
const IORING_OFF_CQ_RING = 0x8000000;
const IORING_OFF_SQES = 0x10000000;
const PROT_RW = 0x1 | 0x2;
const MAP_SHARED_POPULATE = 0x01 | 0x8000;
const EINTR = 4;
// io_uring_params field offsets
const P_SQ_ENTRIES = 0, P_CQ_ENTRIES = 4, P_FEATURES = 20, P_SQ_OFF = 40, P_CQ_OFF = 80;
// sq_off / cq_off member offsets
const SQ_HEAD = 0, SQ_TAIL = 4, SQ_MASK = 8, SQ_ARRAY = 24;
const CQ_HEAD = 0, CQ_TAIL = 4, CQ_MASK = 8, CQ_CQES = 20;
const SQE_SIZE = 64, CQE_SIZE = 16;

const libc = dlopen("libc.so.6", {
  syscall: { args: [FFIType.i64, FFIType.i64, FFIType.i64, FFIType.i64, FFIType.i64, FFIType.i64, FFIType.i64], returns: FFIType.i64 },
  mmap: { args: [FFIType.ptr, FFIType.u64, FFIType.i32, FFIType.i32, FFIType.i32, FFIType.i64], returns: FFIType.ptr },
  munmap: { args: [FFIType.ptr, FFIType.u64], returns: FFIType.i32 },
  close: { args: [FFIType.i32], returns: FFIType.i32 },
  __errno_location: { args: [], returns: FFIType.ptr },
});

function errno(): number {
  return read.i32(libc.symbols.__errno_location()!, 0);
}

/** A failed io_uring system call; `errno` is the raw number. */
export class IoUringError extends Error {
  constructor(readonly call: string, readonly errno: number) {
    super(`${call} failed: errno ${errno}`);
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

/**
 * An io_uring instance with `entries` SQ slots. Not thread-safe; use from one thread.
 * @throws IoUringError when setup or mmap fails (e.g. io_uring disabled by sysctl/seccomp)
 */
export class IoUring {
  readonly fd: number;
  readonly entries: number;
  private readonly maps: Array<[Pointer, number]> = [];
  private readonly sq: Uint32Array;
  private readonly cq: Uint32Array;
  private readonly sqeWords: Uint32Array;
  private readonly cqes: DataView;
  private readonly sqHead: number; // indexes into the Uint32Array views
  private readonly sqTail: number;
  private readonly sqMask: number;
  private readonly cqHead: number;
  private readonly cqTail: number;
  private readonly cqMask: number;
  private closed = false;

  constructor(entries = 64) {
    const params = new Uint8Array(120);
    const fd = Number(libc.symbols.syscall(SYS_io_uring_setup, entries, ptr(params), 0, 0, 0, 0));
    if (fd < 0) throw new IoUringError("io_uring_setup", errno());
    this.fd = fd;
    const dv = new DataView(params.buffer);
    const sqEntries = dv.getUint32(P_SQ_ENTRIES, true), cqEntries = dv.getUint32(P_CQ_ENTRIES, true);
    this.entries = sqEntries;
    const so = (k: number) => dv.getUint32(P_SQ_OFF + k, true);
    const co = (k: number) => dv.getUint32(P_CQ_OFF + k, true);
    const sqLen = so(SQ_ARRAY) + sqEntries * 4;
    const cqLen = co(CQ_CQES) + cqEntries * CQE_SIZE;
    const single = (dv.getUint32(P_FEATURES, true) & IORING_FEAT_SINGLE_MMAP) !== 0;
    try {
      const sqPtr = this.map(single ? Math.max(sqLen, cqLen) : sqLen, IORING_OFF_SQ_RING);
      const cqPtr = single ? sqPtr : this.map(cqLen, IORING_OFF_CQ_RING);
      const sqeLen = sqEntries * SQE_SIZE;
      const sqePtr = this.map(sqeLen, IORING_OFF_SQES);
      const sqBuf = toArrayBuffer(sqPtr, 0, single ? Math.max(sqLen, cqLen) : sqLen);
      const cqBuf = single ? sqBuf : toArrayBuffer(cqPtr, 0, cqLen);
      this.sq = new Uint32Array(sqBuf);
      this.cq = new Uint32Array(cqBuf);
      this.sqeWords = new Uint32Array(toArrayBuffer(sqePtr, 0, sqeLen));
      this.cqes = new DataView(cqBuf, co(CQ_CQES), cqEntries * CQE_SIZE);
      this.sqHead = so(SQ_HEAD) / 4;
      this.sqTail = so(SQ_TAIL) / 4;
      this.sqMask = this.sq[so(SQ_MASK) / 4]!;
      this.cqHead = co(CQ_HEAD) / 4;
      this.cqTail = co(CQ_TAIL) / 4;
      this.cqMask = this.cq[co(CQ_MASK) / 4]!;
      const arr = so(SQ_ARRAY) / 4;
      for (let i = 0; i < sqEntries; i++) this.sq[arr + i] = i;
    } catch (e) {
      this.close();
      throw e;
    }
  }

  private map(len: number, off: number): Pointer {
    const p = libc.symbols.mmap(null, len, PROT_RW, MAP_SHARED_POPULATE, this.fd, off) as Pointer | null;
    if (p === null || Number(p) === -1) throw new IoUringError("mmap", errno());
    this.maps.push([p, len]);
    return p;
  }

  /**
   * Submit every read (on `fd`, or each request's own `fd`), wait for all completions. The buffers are referenced by address during
   * the call only; no JS runs until the kernel is done with them.
   * @returns bytes read per request (short at end of file)
   * @throws IoUringError on a failed enter or a read that failed (negative res)
   */
  readBatch(fd: number, reqs: readonly ReadRequest[], out: number[] = []): number[] {
    if (reqs.length > this.entries) throw new IoUringError(`batch of ${reqs.length} > ${this.entries} entries`, 22);
    let tail = Atomics.load(this.sq, this.sqTail);
    const w = this.sqeWords;
    for (let i = 0; i < reqs.length; i++) {
      const r = reqs[i]!;
      const o = ((tail & this.sqMask) * SQE_SIZE) >>> 2; // in 32-bit words
      w.fill(0, o, o + SQE_SIZE / 4);
      w[o] = IORING_OP_READ; // opcode byte 0; flags, ioprio 0
      w[o + 1] = r.fd ?? fd;
      w[o + 2] = r.offset % 2 ** 32;
      w[o + 3] = Math.floor(r.offset / 2 ** 32);
      const addr = ptr(r.buf, r.bufOffset) as number;
      w[o + 4] = addr % 2 ** 32;
      w[o + 5] = Math.floor(addr / 2 ** 32);
      w[o + 6] = r.length;
      w[o + 8] = i; // user_data
      tail = (tail + 1) >>> 0;
    }
    Atomics.store(this.sq, this.sqTail, tail);
    let want = reqs.length, submitted = false, failed = 0;
    out.length = reqs.length;
    while (want > 0) {
      const n = Number(libc.symbols.syscall(SYS_io_uring_enter, this.fd, submitted ? 0 : reqs.length, want, IORING_ENTER_GETEVENTS, 0, 0));
      if (n < 0) {
        const e = errno();
        if (e === EINTR) continue;
        throw new IoUringError("io_uring_enter", e);
      }
      submitted = true;
      let head = Atomics.load(this.cq, this.cqHead);
      const ctail = Atomics.load(this.cq, this.cqTail);
      while (head !== ctail) {
        const o = (head & this.cqMask) * CQE_SIZE;
        const idx = this.cqes.getUint32(o, true);
        const res = this.cqes.getInt32(o + 8, true);
        if (res < 0 && failed === 0) failed = -res; // keep reaping so no stale CQE is left behind
        out[idx] = res;
        head = (head + 1) >>> 0;
        want--;
      }
      Atomics.store(this.cq, this.cqHead, head);
    }
    if (failed) throw new IoUringError("read", failed);
    return out;
  }

  /** Unmap the rings and close the ring fd (idempotent). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const [p, len] of this.maps) libc.symbols.munmap(p, len);
    libc.symbols.close(this.fd);
  }
}
