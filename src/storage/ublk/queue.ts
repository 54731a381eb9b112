/**
 * One ublk queue, served on its own thread (a Worker: the driver binds a queue to the task that
 * fetched its tags, and the blocking io_uring_enter must not stall the event loop). The thread
 * owns one io_uring: it parks every tag with FETCH_REQ, and for each request the kernel hands
 * over (descriptor in the mmap'd `ublksrv_io_desc` array) it either answers from the target's
 * direct plan — file reads and writes as more SQEs in the same ring, zero fill in place, CoW
 * chunk copies — or forwards it to the main thread, which owns the BlockImage. Answers go back
 * with COMMIT_AND_FETCH_REQ, batched into the next io_uring_enter. A read's pieces are READ
 * SQEs with RWF_NOWAIT chained (IOSQE_IO_LINK) to its COMMIT, without CQEs when they succeed:
 * one io_uring_enter reads page-cached data and answers, no system call of its own per request.
 * RWF_NOWAIT keeps every chained read in this thread (data not cached: -EAGAIN, never a punt to
 * an io-wq worker, which would then issue the COMMIT itself, and the driver refuses commands
 * from any task but the queue's). A read that fails, comes short, or would block breaks the
 * chain (its CQE says which; the COMMIT does not run), and the rest is read unchained. The main thread returns its
 * results through a shared mailbox and rings an eventfd doorbell that a READ in this ring waits
 * on. STOP_DEV makes the kernel complete every parked tag with UBLK_IO_RES_ABORT; when all tags
 * are aborted the loop ends. Lifecycle facts: ../shared/docs/ublk-iouring-firecracker.md §1.4,
 * §1.7–1.10 (copy mode: the server's buffer address goes with every FETCH and COMMIT).
 */
import { IORING_FSYNC_DATASYNC, IORING_OP, IOSQE, IoUring, SQE } from "../../ffi/io_uring.ts";
import { mapMemory, unmapMemory, viewMemory } from "../../ffi/mmap.ts";
import { RWF_NOWAIT } from "../../ffi/preadv2.ts";
import { encodeIoCmd, IO_DESC, ioOpcode, UBLK_IO, UBLK_IO_OP, UBLK_IO_RES } from "../../ffi/ublk.ts";
import { logger } from "../../observability/log.ts";
import { cowFilesOf, cowFlush, cowWrite, planCowRead, type CowFiles } from "./cow.ts";
import { isDiverted, planExtentRead, type DirectPlan, type ExtentPlan, type PlanFile, type ReadPiece } from "./plan.ts";
import { errorMessage } from "../../util/error.ts";

/**
 * What the main thread hands a queue thread when it starts (structured-clone data; fds and
 * addresses are process-wide). The thread then waits for a `QueueCommand`: `serve` (what it
 * serves, see `QueueServe`) or `stop`. A pre-created device (the disk daemon's warm pool) has its
 * threads started and waiting before it knows its image.
 */
export interface QueueSetup {
  devId: number;
  qId: number;
  /** Tags of this queue. */
  depth: number;
  /** Buffer bytes per tag (the device's max_io_buf_bytes). */
  maxIoBytes: number;
  /** Open /dev/ublkcN. */
  charFd: number;
  /** This queue's descriptor mapping (mapped read-only by the main thread). */
  descPtr: number;
  descLength: number;
  /** This queue's buffers: tag t at `bufPtr + t * maxIoBytes` (mapped by the main thread). */
  bufPtr: number;
  /** Send ioctl-encoded opcodes (else legacy numbers). */
  encodedOps: boolean;
  /** Int32Array view source: [0] tail (main), [1] head (this thread), then `mailboxCap` (tag, result) pairs. */
  mailbox: SharedArrayBuffer;
  /** Entries of the mailbox (a power of two > depth). */
  mailboxCap: number;
  /** Float64Array view source: this queue's `QUEUE_COUNTERS` (only this thread writes them). */
  counters: SharedArrayBuffer;
  /** eventfd the main thread signals after adding results to the mailbox. */
  doorbellFd: number;
  /** IORING_SETUP_* flags of the queue ring. */
  ringFlags: number;
}

/** What a queue thread serves, sent once the device has its image (`{ type: "serve", ...QueueServe }`). */
export interface QueueServe {
  /** Device size in bytes; requests past it fail with EIO. */
  size: number;
  readOnly: boolean;
  plan: DirectPlan | null;
  /** Bit per 4 KiB block that must be read through the main thread (extent plans with main-thread writes). */
  divert: Int32Array | null;
}

/** Everything `runQueue` needs. */
export type QueueInit = QueueSetup & QueueServe;

/** Messages to a queue thread: serve (then it runs until its tags are aborted), or end without serving. */
export type QueueCommand = ({ type: "serve" } & QueueServe) | { type: "stop" };

/**
 * Messages from a queue thread: `loaded` (started, waiting for its QueueCommand), `ready` (every
 * tag fetched), `exit`. A forwarded request is `[tag, op, flags, offset, length]` (bytes).
 */
export type QueueMessage =
  | { type: "loaded" }
  | { type: "ready" }
  | { type: "exit"; reason: string }
  | [number, number, number, number, number];

/**
 * Counters each queue thread keeps of the requests it answered (direct and forwarded alike), at
 * these indexes of its `counters` array: requests, bytes; `enters`: its io_uring_enter calls that
 * waited (requests per enter tells how well answers and new requests are batched).
 */
export const QUEUE_COUNTERS = { reads: 0, bytesRead: 1, writes: 2, bytesWritten: 3, flushes: 4, discards: 5, errors: 6, enters: 7 } as const;
/** Length of one queue's counters array. */
export const QUEUE_COUNTER_SLOTS = 8;

/** Mailbox tag that tells the queue thread to stop serving at once (used when the kernel cannot abort it). */
export const MAILBOX_STOP = -1;

/** user_data kinds (high 32 bits; kind 0 is a tag's FETCH/COMMIT): a piece's I/O, the doorbell read, a piece read chained to its COMMIT. */
const KIND_IO = 1, KIND_DOORBELL = 2, KIND_CHAINED = 3;
const TWO32 = 2 ** 32;
const EIO = 5, EAGAIN = 11, EOPNOTSUPP = 95, ECANCELED = 125;
/** A chained read: the next SQE (read or COMMIT) waits for it; no CQE unless it fails or comes short. */
const CHAINED = IOSQE.IO_LINK | IOSQE.CQE_SKIP_SUCCESS;

/**
 * The answer a request gets before it is served: EIO when it reaches past the device end (bytes
 * `offset .. offset + length` beyond `size`; a FLUSH carries no range and always passes), else 0.
 * The block layer clips requests at the capacity it was told, so only a server whose size
 * disagrees with the kernel's (or a malformed descriptor) sees one.
 * @returns 0, or the negative errno to commit
 */
export function rangeCheck(op: number, offset: number, length: number, size: number): number {
  if (op === UBLK_IO_OP.FLUSH) return 0;
  return offset + length > size ? -EIO : 0;
}

/** Where the main thread's view of a mailbox puts a result; see `QueueSetup.mailbox`. */
export function mailboxPut(mb: Int32Array, cap: number, tag: number, result: number): void {
  const t = Atomics.load(mb, 0);
  const i = 2 + (t & (cap - 1)) * 2;
  mb[i] = tag;
  mb[i + 1] = result;
  Atomics.store(mb, 0, (t + 1) | 0);
}

/**
 * Serve one queue until every tag is aborted (STOP_DEV, device removal) or a stop token arrives.
 * Runs on the calling thread and blocks it.
 * @returns why serving ended
 */
export function runQueue(init: QueueInit, post: (m: QueueMessage) => void): string {
  const log = logger("ublk", { devId: init.devId, queue: init.qId });
  const { depth, maxIoBytes: maxIo, charFd, qId } = init;
  const ring = new IoUring({ entries: Math.min(4096, nextPow2(2 * depth + 2)), cqEntries: Math.min(8192, nextPow2(4 * depth + 4)), flags: init.ringFlags });
  const desc = new DataView(viewMemory(init.descPtr, init.descLength));
  const arena = new Uint8Array(viewMemory(init.bufPtr, depth * maxIo));
  const bell = mapMemory(4096);
  const mb = new Int32Array(init.mailbox);
  const FETCH = ioOpcode(UBLK_IO.FETCH_REQ, init.encodedOps), COMMIT = ioOpcode(UBLK_IO.COMMIT_AND_FETCH_REQ, init.encodedOps);
  const ext: ExtentPlan | null = init.plan?.kind === "extents" ? init.plan : null;
  const cow: CowFiles | null = init.plan?.kind === "cow" ? cowFilesOf(init.plan) : null;
  const files: PlanFile[] = ext ? ext.files : cow ? [cow.origin, cow.cow] : [];
  const writeFile = ext ? ext.writeFile : -1;

  // per tag: request length (bytes), pieces in flight, first error, the pieces themselves
  const reqLen = new Float64Array(depth);
  const reqOp = new Uint8Array(depth);
  const inflight = new Int32Array(depth);
  const failure = new Int32Array(depth);
  const pieces: ReadPiece[][] = Array.from({ length: depth }, () => []);
  const pieceOp = new Uint8Array(depth);
  let aborted = 0;
  let stop = "";

  const command = (op: number, tag: number, result: number) => {
    const w = ring.prepUringCmd(charFd, op, tag);
    encodeIoCmd(ring.sqeWords, w + SQE.CMD / 4, qId, tag, result, init.bufPtr + tag * maxIo);
  };
  const counters = new Float64Array(init.counters);
  const C = QUEUE_COUNTERS;
  const commit = (tag: number, result: number) => {
    const op = reqOp[tag]!;
    if (result < 0) counters[C.errors]! += 1;
    else if (op === UBLK_IO_OP.READ) {
      counters[C.reads]! += 1;
      counters[C.bytesRead]! += result;
    } else if (op === UBLK_IO_OP.WRITE) {
      counters[C.writes]! += 1;
      counters[C.bytesWritten]! += result;
    } else if (op === UBLK_IO_OP.FLUSH) counters[C.flushes]! += 1;
    else counters[C.discards]! += 1;
    command(COMMIT, tag, result);
  };
  const armDoorbell = () => ring.prep({ opcode: IORING_OP.READ, fd: init.doorbellFd, addr: bell.ptr, len: 8, userData: KIND_DOORBELL * TWO32 });
  const pieceSqe = (tag: number, i: number, chained = false) => {
    const p = pieces[tag]![i]!;
    ring.prepFields(pieceOp[tag]!, files[p.file]!.fd, p.fileOffset, init.bufPtr + tag * maxIo + p.bufOffset, p.length, (chained ? KIND_CHAINED : KIND_IO) * TWO32 + tag * 65536 + i, chained ? CHAINED : 0, chained ? RWF_NOWAIT : 0);
  };
  /** Files that cannot be read without blocking (RWF_NOWAIT: EOPNOTSUPP, e.g. tmpfs on 6.1): never chained. */
  const unchainable = new Uint8Array(files.length);
  const startPieces = (tag: number, op: number) => {
    const list = pieces[tag]!;
    failure[tag] = 0;
    pieceOp[tag] = op;
    if (list.length === 0) return commit(tag, reqLen[tag]!);
    inflight[tag] = list.length;
    let chainable = op === IORING_OP.READ;
    for (let i = 0; chainable && i < list.length; i++) if (unchainable[list[i]!.file]) chainable = false;
    if (chainable) {
      // the whole chain in one submission: a chain cut by an implicit submit would let the COMMIT run early
      if (ring.space < list.length + 1) ring.submit(0);
      if (ring.space >= list.length + 1) {
        for (let i = 0; i < list.length; i++) pieceSqe(tag, i, true);
        return commit(tag, reqLen[tag]!);
      }
    }
    for (let i = 0; i < list.length; i++) pieceSqe(tag, i);
  };
  /**
   * Chained read `i` of `tag` would block (-EAGAIN: not cached; -EOPNOTSUPP: the file cannot say),
   * failed (other `res` < 0), or came short (not all cached, or EOF inside it): the reads after it
   * and the COMMIT did not run (their CQEs, if any, are -ECANCELED and ignored). A failure answers
   * EIO; otherwise the read goes on unchained (and may block) from where it stopped, with the
   * pieces after it.
   */
  const chainBroken = (tag: number, i: number, res: number) => {
    // the COMMIT counted the request as answered: it was not
    counters[C.reads]! -= 1;
    counters[C.bytesRead]! -= reqLen[tag]!;
    const list = pieces[tag]!;
    const p = list[i]!;
    if (res === -EOPNOTSUPP) unchainable[p.file] = 1;
    else if (res === -EAGAIN) {
      // read it blocking, below
    } else if (res <= 0) {
      pieceFailed(tag, p, IORING_OP.READ, res);
      return commit(tag, failure[tag]!);
    } else {
      p.fileOffset += res;
      p.bufOffset += res;
      p.length -= res;
    }
    list.splice(0, i);
    inflight[tag] = list.length;
    for (let k = 0; k < list.length; k++) pieceSqe(tag, k);
  };
  const forward = (tag: number, op: number, flags: number, offset: number, length: number) => post([tag, op, flags, offset, length]);

  const handle = (tag: number) => {
    const at = tag * IO_DESC.SIZE;
    const opFlags = desc.getUint32(at + IO_DESC.OP_FLAGS, true);
    const op = opFlags & 0xff;
    const length = desc.getUint32(at + IO_DESC.NR_SECTORS, true) * 512;
    const offset = (desc.getUint32(at + IO_DESC.START_SECTOR, true) + desc.getUint32(at + IO_DESC.START_SECTOR + 4, true) * TWO32) * 512;
    reqLen[tag] = length;
    reqOp[tag] = op;
    const refused = rangeCheck(op, offset, length, init.size);
    if (refused < 0) {
      log.warn({ tag, op, offset, length, size: init.size }, "request past the device end: I/O error");
      return commit(tag, refused);
    }
    const list = pieces[tag]!;
    list.length = 0;
    switch (op) {
      case UBLK_IO_OP.READ:
        if (ext && !(init.divert && isDiverted(init.divert, offset, length))) {
          const base = tag * maxIo;
          planExtentRead(ext, offset, length, list, (b, n) => arena.fill(0, base + b, base + b + n));
          return startPieces(tag, IORING_OP.READ);
        }
        if (cow) {
          planCowRead(cow, offset, length, list);
          return startPieces(tag, IORING_OP.READ);
        }
        return forward(tag, op, opFlags & ~0xff, offset, length);
      case UBLK_IO_OP.WRITE:
        if (init.readOnly) return commit(tag, -EIO);
        if (writeFile >= 0) {
          list.push({ file: writeFile, fileOffset: offset, bufOffset: 0, length });
          return startPieces(tag, IORING_OP.WRITE);
        }
        if (cow) {
          try {
            cowWrite(cow, arena.subarray(tag * maxIo, tag * maxIo + length), offset);
            return commit(tag, length);
          } catch (e) {
            log.error({ err: errorMessage(e), ...(e as { details?: object }).details, tag, offset, length }, "CoW write failed");
            return commit(tag, -EIO);
          }
        }
        return forward(tag, op, opFlags & ~0xff, offset, length);
      case UBLK_IO_OP.FLUSH:
        if (writeFile >= 0) {
          pieceOp[tag] = IORING_OP.FSYNC;
          inflight[tag] = 1;
          failure[tag] = 0;
          reqLen[tag] = 0;
          list.push({ file: writeFile, fileOffset: 0, bufOffset: 0, length: 0 });
          ring.prep({ opcode: IORING_OP.FSYNC, fd: files[writeFile]!.fd, opFlags: IORING_FSYNC_DATASYNC, userData: KIND_IO * TWO32 + tag * 65536 });
          return;
        }
        if (cow) {
          try {
            cowFlush(cow);
            return commit(tag, 0);
          } catch (e) {
            log.error({ err: errorMessage(e), tag }, "flush failed");
            return commit(tag, -EIO);
          }
        }
        return forward(tag, op, opFlags & ~0xff, offset, length);
      case UBLK_IO_OP.DISCARD:
      case UBLK_IO_OP.WRITE_ZEROES:
        if (init.readOnly) return commit(tag, -EIO);
        return forward(tag, op, opFlags & ~0xff, offset, length);
      default:
        return commit(tag, -EOPNOTSUPP);
    }
  };

  const pieceFailed = (tag: number, p: ReadPiece, op: number, res: number) => {
    if (failure[tag] === 0) {
      const f = files[p.file]!;
      const what = op === IORING_OP.READ ? "read" : op === IORING_OP.WRITE ? "write" : "fdatasync";
      // a layer file ending inside an extent is corrupt (truncated): fail, never invent bytes
      if (res < 0) log.error({ file: f.name, offset: p.fileOffset, length: p.length, errno: -res }, `${what} of ${f.name} at ${p.fileOffset} failed: errno ${-res}`);
      else log.error({ file: f.name, offset: p.fileOffset, length: p.length }, `short ${what} of ${f.name} at ${p.fileOffset}: the file ends inside the image's data`);
    }
    failure[tag] = -EIO;
  };

  const pieceDone = (tag: number, i: number, res: number) => {
    const p = pieces[tag]![i]!;
    const op = pieceOp[tag]!;
    if (op !== IORING_OP.FSYNC && res > 0 && res < p.length) {
      // a short transfer that is not the end of the file: go on with the rest
      p.fileOffset += res;
      p.bufOffset += res;
      p.length -= res;
      pieceSqe(tag, i);
      return;
    }
    if (res < 0 || (res === 0 && p.length > 0)) pieceFailed(tag, p, op, res);
    if (--inflight[tag]! === 0) commit(tag, failure[tag] || reqLen[tag]!);
  };

  const drainMailbox = () => {
    let h = Atomics.load(mb, 1);
    const t = Atomics.load(mb, 0);
    while (h !== t) {
      const i = 2 + (h & (init.mailboxCap - 1)) * 2;
      const tag = mb[i]!, result = mb[i + 1]!;
      if (tag === MAILBOX_STOP) stop = "stop requested";
      else commit(tag, result);
      h = (h + 1) | 0;
    }
    Atomics.store(mb, 1, h);
  };

  const onCqe = (ud: number, res: number) => {
    const kind = Math.floor(ud / TWO32);
    const low = ud % TWO32;
    if (kind === 0) {
      if (res === UBLK_IO_RES.OK) return handle(low);
      // a COMMIT chained behind reads that failed did not run (chainBroken answers the request)
      if (res === -ECANCELED) return;
      if (res !== UBLK_IO_RES.ABORT) log.error({ tag: low, errno: -res }, `I/O command for tag ${low} refused: errno ${-res}`);
      if (++aborted === depth) stop ||= "all tags aborted";
      return;
    }
    if (kind === KIND_IO) return pieceDone(Math.floor(low / 65536), low % 65536, res);
    if (kind === KIND_CHAINED) {
      // successful chained reads post nothing; the one that broke the chain posts its result
      if (res !== -ECANCELED) chainBroken(Math.floor(low / 65536), low % 65536, res);
      return;
    }
    if (kind === KIND_DOORBELL) {
      if (res < 0 && res !== -4) log.warn({ errno: -res }, "doorbell read failed");
      drainMailbox();
      if (!stop) armDoorbell();
    }
  };

  let reason = "";
  try {
    for (let tag = 0; tag < depth; tag++) command(FETCH, tag, 0);
    armDoorbell();
    ring.submit(0);
    post({ type: "ready" });
    while (!stop) {
      ring.submit(1);
      counters[C.enters]! += 1;
      ring.reap(onCqe);
    }
    reason = stop;
  } catch (e) {
    reason = `queue failed: ${errorMessage(e)}`;
    log.error({ err: errorMessage(e) }, "queue thread failed");
  } finally {
    ring.close();
    unmapMemory(bell);
  }
  return reason;
}

/** The smallest power of two >= `n` (1 for n <= 1): ring and mailbox sizes. */
export function nextPow2(n: number): number {
  let p = 1;
  while (p < n) p *= 2;
  return p;
}
