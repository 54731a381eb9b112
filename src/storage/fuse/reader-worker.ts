/**
 * Entry module of a FUSE reader thread (started by `FuseReaderPool`, listed in
 * `WORKER_ENTRYPOINTS` of src/bundle.ts so `bun build --compile` embeds it). One thread serves every connection
 * of the process: it waits in epoll on all their /dev/fuse fds (non-blocking, level-triggered),
 * reads one request at a time, and
 * - answers READ of the served file itself, by pread on the plain files of the connection's
 *   direct plan (and WRITE by pwrite when the plan has a `writeFd`, a raw file), from one buffer
 *   allocated at start: reply header and data contiguous, one write(2) per reply;
 * - hands every other request, a READ touching a block marked in `dirty`, and every request once
 *   the connection is closing, to the main thread, which owns the BlockImage and replies.
 * Blocking waits must live off the main thread: a parked read would stall its event loop.
 *
 * workerData: { index, epfd, wakeFd, port, bufSize, splice }. `epfd` is this thread's epoll instance (the
 * main thread adds and removes connection fds with data = their slot number; slot 0 is `wakeFd`,
 * an eventfd the main thread signals after posting a control message on `port`).
 * Control messages (main -> thread, on `port`):
 *  - { op: "add", slot, fd, direct: Direct | null, ctl, counters } and { op: "update", slot, direct }
 *  - { op: "remove", slot }, { op: "stop" }
 * where Direct = { size, ext, writeFd, zeroFill, dirty }:
 *  - `ext` (Float64Array): EXTENT_FIELDS (5) numbers per extent, sorted by offset: virtual
 *    offset, length, fd, file offset, and the file's size when the plan was made (bytes; the
 *    files of a plan never shrink); virtual bytes outside every extent read as zeros;
 *  - `writeFd`: fd WRITE goes to at the virtual offset itself (identity map), -1 = WRITE goes to
 *    the main thread;
 *  - `zeroFill`: a file shorter than its extent reads as zeros past its end (else the reply is
 *    short there, like a raw file's pread);
 *  - `dirty` (Int32Array over a SharedArrayBuffer, or null): bit b set = the 4 KiB block b may
 *    differ from `ext` (written through the main thread); set before such a write starts, never
 *    cleared;
 * and per connection `ctl` (Int32Array, shared): [0] = 1 once closing (hand everything to the
 * main thread), [1] = requests being served directly right now; `counters` (Float64Array, shared):
 * 6 per thread at `index * 6`: reads, bytesRead, writes, bytesWritten, errors, reads answered by
 * splice (only this thread writes its slots).
 * A READ of at least SPLICE_MIN bytes that one extent holds whole is answered with splice(2):
 * the reply header is written into a pipe, the file's pages are spliced in after it by
 * reference, and the pipe is spliced into /dev/fuse (one copy of the data instead of two). A
 * pipe slot holds one page: the pipe must have a slot per page of the range plus one for the
 * header. Without CAP_SYS_RESOURCE it is at most fs.pipe-max-size (1 MiB = 256 slots by default),
 * so a whole 1 MiB READ is then copied; raising the sysctl to 2 MiB lets it be spliced.
 * Messages out (parentPort): { slot, req: ArrayBuffer } (a request for the main thread),
 * { slot, removed: index } after a "remove", { slot, ended: string } when a connection ends (ENODEV after unmount, ECONNABORTED after abort),
 * { slot, fail: string, op, offset, size } when a direct I/O failed (answered EIO),
 * { warn: string } when a reply could not be written for another reason than an
 * interrupted/aborted request.
 * Protocol offsets: ../shared/docs/fuse-nbd.md §1.2, §1.5 (in header 40 bytes; read/write_in
 * offset @8, size @16 of the body; WRITE data at body offset 40; out header 16 bytes).
 */
import { parentPort, receiveMessageOnPort, workerData, type MessagePort } from "node:worker_threads";
import { addressOf, epollDel, epollWait, Errno, eventData, preadAt, pwriteAt, readAt, writeAt } from "../../ffi/epoll.ts";
import { drainEventfd } from "../../ffi/eventfd.ts";
import { pipeCapacity, pipeClose, pipeCreate, spliceFromFile, spliceToFd, type Pipe } from "../../ffi/splice.ts";
import { readFileSync } from "node:fs";

/** Numbers per extent in `DirectMsg.ext`: virtual offset, length, fd, file offset, file size. */
export const EXTENT_FIELDS = 5;
/** Smallest READ answered by splice (below it the copy path's two system calls are cheaper). */
export const SPLICE_MIN = 64 * 1024;

/** Where a connection's bytes live, as sent by the main thread. */
export interface DirectMsg {
  size: number;
  ext: Float64Array;
  writeFd: number;
  zeroFill: boolean;
  dirty: Int32Array | null;
}

/** Control messages from the main thread. */
export type ControlMsg =
  | { op: "add"; slot: number; fd: number; direct: DirectMsg | null; ctl: Int32Array; counters: Float64Array }
  | { op: "update"; slot: number; direct: DirectMsg | null }
  | { op: "remove"; slot: number }
  | { op: "stop" };

/** Start-up data of a reader thread. */
export interface ReaderData {
  index: number;
  epfd: number;
  wakeFd: number;
  port: MessagePort;
  bufSize: number;
  /** Answer large READs with splice(2). */
  splice: boolean;
}

interface Conn {
  fd: number;
  direct: DirectMsg | null;
  ctl: Int32Array;
  counters: Float64Array;
}

const OP_READ = 15, OP_WRITE = 16, FILE_INO = 2, EIO = 5, EINVAL = 22, ENOSPC = 28;
/** Requests read from one connection before looking at the others again. */
const BATCH = 32;
/** Out header right before the reply data; data page-aligned (a misaligned copy measured 5x slower). */
const DATA = 4096, HDR = DATA - 16;

/** fs.pipe-max-size: the largest pipe an unprivileged F_SETPIPE_SZ may ask for, bytes. */
function maxPipeSize(): number {
  try {
    return Number(readFileSync("/proc/sys/fs/pipe-max-size", "utf8").trim()) || 1 << 20;
  } catch {
    return 1 << 20;
  }
}

function run(d: ReaderData): void {
  const { index, epfd, wakeFd, port, bufSize, splice } = d;
  const out = parentPort!;
  const conns = new Map<number, Conn>();
  const buf = new Uint8Array(bufSize);
  const bufAt = addressOf(buf);
  const inView = new DataView(buf.buffer);
  const reply = new Uint8Array(DATA + bufSize);
  const replyAt = addressOf(reply);
  const outView = new DataView(reply.buffer);
  const events = new Uint8Array(12 * 64);
  const eventsView = new DataView(events.buffer);
  const c = index * 6;
  let stopping = false;
  // the splice path's pipe: room for the reply header's page plus a whole payload; above
  // fs.pipe-max-size (1 MiB by default) only with CAP_SYS_RESOURCE, else as large as allowed,
  // and READs larger than it holds take the copy path
  let pipe: Pipe | null = null;
  /** Pages of file data a spliced reply may span: the pipe's slots less the header's (0 = no splice). */
  let splicePages = 0;
  for (const want of splice ? [bufSize + 2 * DATA, maxPipeSize()] : []) {
    try {
      pipe = pipeCreate(want);
      splicePages = Math.floor(pipeCapacity(pipe) / DATA) - 1;
      break;
    } catch {
      // try the next size
    }
  }
  if (!pipe && splice) out.postMessage({ warn: "no splice pipe: every READ reply is copied" });
  // the splice path's reply header: the first 16 bytes of `reply` (unused by the copy path, whose
  // header sits at HDR); a small typed array of its own could move in the heap under its address
  const hdrAt = replyAt;
  const posBuf = new BigInt64Array(1);
  /** Empty the pipe after a failed splice (its bytes are dropped). */
  const drainPipe = (): void => {
    while (readAt(pipe!.readFd, replyAt, reply.byteLength) > 0);
  };

  /**
   * Answer a READ of [foff, foff + len) of file `efd` by splice; false when it could not be
   * sent that way (nothing was answered; the pipe is empty again).
   */
  const spliceRead = (conn: Conn, efd: number, foff: number, len: number): boolean => {
    const p = pipe!;
    outView.setUint32(0, 16 + len, true);
    outView.setInt32(4, 0, true);
    outView.setUint32(8, inView.getUint32(8, true), true);
    outView.setUint32(12, inView.getUint32(12, true), true);
    if (writeAt(p.writeFd, hdrAt, 16) !== 16) {
      drainPipe();
      return false;
    }
    for (let got = 0; got < len;) {
      const r = spliceFromFile(efd, foff + got, p.writeFd, len - got, posBuf);
      if (r === -Errno.EINTR) continue;
      if (r <= 0) {
        drainPipe();
        return false;
      }
      got += r;
    }
    // counted before the reply, as the copy path does: a reader that got its data sees it in the stats
    conn.counters[c]! += 1;
    conn.counters[c + 1]! += len;
    conn.counters[c + 5]! += 1;
    const w = spliceToFd(p.readFd, conn.fd, 16 + len);
    if (w === 16 + len) return true;
    // the pipe may still hold what the kernel did not take
    drainPipe();
    // the request is gone (interrupted, unmounted, aborted): nothing left to answer
    if (w === -Errno.ENOENT || w === -Errno.ENODEV || w === -Errno.ECONNABORTED) return true;
    // the kernel refused the spliced reply: answer by copying, now and from now on
    conn.counters[c]! -= 1;
    conn.counters[c + 1]! -= len;
    conn.counters[c + 5]! -= 1;
    splicePages = 0;
    out.postMessage({ warn: `reply splice refused (errno ${-w}): READ replies are copied from now on` });
    return false;
  };

  const drain = (): void => {
    for (let m = receiveMessageOnPort(port); m; m = receiveMessageOnPort(port)) {
      const msg = m.message as ControlMsg;
      if (msg.op === "add") conns.set(msg.slot, { fd: msg.fd, direct: msg.direct, ctl: msg.ctl, counters: msg.counters });
      else if (msg.op === "update") {
        const conn = conns.get(msg.slot);
        if (conn) conn.direct = msg.direct;
      } else if (msg.op === "remove") {
        conns.delete(msg.slot);
        // the main thread closes the fd only after every thread acknowledged: an fd number
        // reused by a new connection is then never read under this slot
        out.postMessage({ slot: msg.slot, removed: index });
      } else stopping = true;
    }
  };

  const send = (conn: Conn, bodyLen: number, errno: number): void => {
    const len = 16 + (errno ? 0 : bodyLen);
    outView.setUint32(HDR, len, true);
    outView.setInt32(HDR + 4, -errno, true);
    // unique: copied from the request header (bit 63 of a resent request kept as is)
    outView.setUint32(HDR + 8, inView.getUint32(8, true), true);
    outView.setUint32(HDR + 12, inView.getUint32(12, true), true);
    if (errno) conn.counters[c + 4]! += 1;
    const r = writeAt(conn.fd, replyAt + HDR, len);
    if (r < 0 && r !== -Errno.ENOENT && r !== -Errno.ENODEV && r !== -Errno.ECONNABORTED) out.postMessage({ warn: `reply write failed: errno ${-r}` });
  };

  /** Serve READ/WRITE of the file from the direct plan; false = not ours, hand it on. */
  const serveDirect = (slot: number, conn: Conn, dp: DirectMsg, n: number): boolean => {
    if (n < 80) return false;
    const op = inView.getUint32(4, true);
    if (op !== OP_READ && op !== OP_WRITE) return false;
    if (inView.getUint32(16, true) !== FILE_INO || inView.getUint32(20, true) !== 0) return false;
    if (op === OP_WRITE && dp.writeFd < 0) return false;
    // u64 offset; anything at or above 2^53 is past every image anyway
    const hi = inView.getUint32(52, true);
    const offset = hi >= 0x200000 ? Number.MAX_SAFE_INTEGER : hi * 4294967296 + inView.getUint32(48, true);
    const size = inView.getUint32(56, true);
    if (op === OP_READ) {
      const len = Math.max(0, Math.min(size, dp.size - offset, bufSize));
      const end = offset + len;
      const dirty = dp.dirty;
      if (dirty && len > 0) {
        for (let b = Math.floor(offset / 4096), last = Math.floor((end - 1) / 4096); b <= last; b++) {
          if ((Atomics.load(dirty, b >>> 5) & (1 << (b & 31))) !== 0) return false;
        }
      }
      const ext = dp.ext;
      const F = EXTENT_FIELDS;
      const count = ext.length / F;
      // first extent ending after `offset`
      let lo = 0, hi2 = count;
      while (lo < hi2) {
        const mid = (lo + hi2) >>> 1;
        if (ext[mid * F]! + ext[mid * F + 1]! <= offset) lo = mid + 1;
        else hi2 = mid;
      }
      // one extent holds the whole range and its file has every byte of it: splice
      if (len >= SPLICE_MIN && len <= splicePages * DATA && lo < count && ext[lo * F]! <= offset && ext[lo * F]! + ext[lo * F + 1]! >= end) {
        const foff = ext[lo * F + 3]! + (offset - ext[lo * F]!);
        // each file page spliced takes a pipe slot: an unaligned range spans one page more
        const pages = Math.ceil(((foff % DATA) + len) / DATA);
        if (pages <= splicePages && foff + len <= ext[lo * F + 4]! && spliceRead(conn, ext[lo * F + 2]!, foff, len)) return true;
      }
      let pos = offset;
      for (let i = lo; pos < end; i++) {
        const start = i < count ? ext[i * F]! : end;
        if (start >= end) {
          reply.fill(0, DATA + pos - offset, DATA + len);
          pos = end;
          break;
        }
        if (start > pos) {
          reply.fill(0, DATA + pos - offset, DATA + start - offset);
          pos = start;
        }
        const stop = Math.min(start + ext[i * F + 1]!, end);
        const efd = ext[i * F + 2]!, foff = ext[i * F + 3]! + (pos - start);
        let got = 0;
        while (pos + got < stop) {
          const r = preadAt(efd, replyAt + DATA + pos - offset + got, stop - pos - got, foff + got);
          if (r === -Errno.EINTR) continue;
          if (r < 0) {
            out.postMessage({ slot, fail: `pread errno ${-r}`, op: "read", offset, size });
            send(conn, 0, EIO);
            return true;
          }
          if (r === 0) break;
          got += r;
        }
        if (pos + got < stop) {
          if (!dp.zeroFill) {
            pos += got;
            break;
          }
          reply.fill(0, DATA + pos - offset + got, DATA + stop - offset);
        }
        pos = stop;
      }
      const done = pos - offset;
      if (len > 0) {
        conn.counters[c]! += 1;
        conn.counters[c + 1]! += done;
      }
      send(conn, done, 0);
      return true;
    }
    const reqLen = inView.getUint32(0, true);
    if (Math.min(reqLen, n) - 80 < size) {
      send(conn, 0, EINVAL);
      return true;
    }
    if (offset + size > dp.size) {
      send(conn, 0, ENOSPC);
      return true;
    }
    let done = 0;
    while (done < size) {
      const r = pwriteAt(dp.writeFd, bufAt + 80 + done, size - done, offset + done);
      if (r === -Errno.EINTR) continue;
      if (r <= 0) {
        out.postMessage({ slot, fail: `pwrite errno ${-r}`, op: "write", offset, size });
        send(conn, 0, EIO);
        return true;
      }
      done += r;
    }
    conn.counters[c + 2]! += 1;
    conn.counters[c + 3]! += size;
    outView.setUint32(DATA, size, true);
    outView.setUint32(DATA + 4, 0, true);
    send(conn, 8, 0);
    return true;
  };

  /** Read and serve up to BATCH requests of one connection. */
  const serveConn = (slot: number, conn: Conn): void => {
    for (let k = 0; k < BATCH; k++) {
      const n = readAt(conn.fd, bufAt, bufSize);
      if (n === -Errno.EAGAIN) return;
      // ENOENT: the request was interrupted before we read it; EINTR: retry
      if (n === -Errno.ENOENT || n === -Errno.EINTR) continue;
      if (n <= 0) {
        // ENODEV after unmount, ECONNABORTED after an abort: this connection is over
        epollDel(epfd, conn.fd);
        conns.delete(slot);
        out.postMessage({ slot, ended: n === 0 ? "EOF" : n === -Errno.ENODEV ? "ENODEV" : n === -Errno.ECONNABORTED ? "ECONNABORTED" : `errno ${-n}` });
        return;
      }
      const dp = conn.direct;
      if (dp) {
        // announce first, then check the flag (both sequentially consistent atomics): close()
        // sets the flag, then, once every thread let go of the connection, checks the count is
        // 0 before it closes the files
        Atomics.add(conn.ctl, 1, 1);
        let served = false;
        try {
          if (Atomics.load(conn.ctl, 0) === 0) served = serveDirect(slot, conn, dp, n);
        } finally {
          Atomics.sub(conn.ctl, 1, 1);
        }
        if (served) continue;
      }
      const req = buf.slice(0, n);
      out.postMessage({ slot, req: req.buffer }, [req.buffer]);
    }
  };

  while (!stopping) {
    const n = epollWait(epfd, events, -1);
    if (n < 0) {
      if (n === -Errno.EINTR) continue;
      out.postMessage({ warn: `epoll_wait failed: errno ${-n}` });
      break;
    }
    for (let i = 0; i < n && !stopping; i++) {
      const slot = eventData(eventsView, i);
      if (slot === 0) {
        drainEventfd(wakeFd);
        drain();
        continue;
      }
      let conn = conns.get(slot);
      if (!conn) {
        // added after our last look at the port (the main thread posts before it adds the fd)
        drain();
        conn = conns.get(slot);
        if (!conn) continue;
      }
      serveConn(slot, conn);
    }
  }
  if (pipe) pipeClose(pipe);
}

if (parentPort && workerData && typeof (workerData as ReaderData).epfd === "number") run(workerData as ReaderData);
