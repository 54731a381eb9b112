/**
 * Body of a reader thread: blocks in read(2) on /dev/fuse. With a `direct` plan (where each byte
 * of the image lives in plain files) READ of the served file is answered right here by pread on
 * those files' fds (and WRITE by pwrite when the plan has a `writeFd`: a raw file), into one
 * buffer allocated at start (reply header and data contiguous: one write(2) per reply, no
 * per-request allocation). Every other request, a READ touching a block marked in `dirty`, and
 * every request once the export is closing, is handed to the main thread (one read = one
 * request), which owns the BlockImage and writes the reply. Blocking reads must live off the
 * main thread: a parked read would stall the event loop.
 *
 * The thread is started with `eval: true` from this function's source text (see `readerSource`),
 * so it also runs from a `bun build --compile` binary, which embeds no separate worker file. The
 * function must therefore use nothing but its parameters.
 *
 * workerData: { fd, bufSize, slot, direct?: { size, ext, writeFd, zeroFill, dirty, ctl, counters } } where
 *  - `ext` (Float64Array): 4 numbers per extent, sorted by offset: virtual offset, length, fd,
 *    file offset (bytes); virtual bytes outside every extent read as zeros;
 *  - `writeFd`: fd WRITE goes to at the virtual offset itself (identity map), -1 = WRITE goes to
 *    the main thread;
 *  - `zeroFill`: a file shorter than its extent reads as zeros past its end (else the reply is
 *    short there, like a raw file's pread);
 *  - `dirty` (Int32Array over a SharedArrayBuffer, or null): bit b set = the 4 KiB block b may
 *    differ from `ext` (written through the main thread); set before such a write starts, never
 *    cleared;
 *  - `ctl` (Int32Array over a SharedArrayBuffer): [0] = 1 once the export is closing (hand
 *    everything to the main thread), [1] = requests being served directly right now;
 *  - `counters` (Float64Array, shared): 6 per thread at `slot * 6`: reads, bytesRead, writes,
 *    bytesWritten, errors, unused. Only this thread writes its slots.
 * Messages out: ArrayBuffer (a request for the main thread), { done: string } when the
 * connection ends (ENODEV after unmount, ECONNABORTED after abort), { fail: string, op, offset,
 * size } when a direct I/O failed (answered EIO; the main thread logs it), { warn: string } when a
 * reply could not be written for another reason than an interrupted/aborted request.
 * Protocol offsets: /work/shared/docs/fuse-nbd.md §1.2, §1.5 (in header 40 bytes; read/write_in
 * offset @8, size @16 of the body; WRITE data at body offset 40; out header 16 bytes).
 */
import type * as Fs from "node:fs";
import type * as WorkerThreads from "node:worker_threads";

interface Direct {
  size: number;
  ext: Float64Array;
  writeFd: number;
  zeroFill: boolean;
  dirty: Int32Array | null;
  ctl: Int32Array;
  counters: Float64Array;
}

function readerLoop(fs: typeof Fs, wt: typeof WorkerThreads): void {
  const { fd, bufSize, slot, direct } = wt.workerData as { fd: number; bufSize: number; slot: number; direct?: Direct };
  const port = wt.parentPort!;
  const buf = new Uint8Array(bufSize);
  const inView = new DataView(buf.buffer);
  // reply buffer: READ data (or a write_out) at DATA (page-aligned: a large ArrayBuffer is, and
  // a copy to or from a destination 16 bytes off a 64-byte boundary measured 5x slower), the
  // 16-byte out header right before it, so a reply is one contiguous write(2)
  const DATA = 4096, HDR = DATA - 16;
  const out = new Uint8Array(DATA + bufSize);
  const outView = new DataView(out.buffer);
  const OP_READ = 15, OP_WRITE = 16, FILE_INO = 2, EIO = 5, EINVAL = 22, ENOSPC = 28;
  const c = direct ? slot * 6 : 0;

  const reply = (bodyLen: number, errno: number): void => {
    const len = 16 + (errno ? 0 : bodyLen);
    outView.setUint32(HDR, len, true);
    outView.setInt32(HDR + 4, -errno, true);
    // unique: copied from the request header (bit 63 of a resent request kept as is)
    outView.setUint32(HDR + 8, inView.getUint32(8, true), true);
    outView.setUint32(HDR + 12, inView.getUint32(12, true), true);
    if (errno && direct) direct.counters[c + 4]! += 1;
    try {
      fs.writeSync(fd, out, HDR, len);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== "ENOENT" && code !== "ENODEV" && code !== "ECONNABORTED") port.postMessage({ warn: String(e) });
    }
  };

  /** Serve READ/WRITE of the file from `direct`; false = not ours, hand it on. */
  const serveDirect = (d: Direct, n: number): boolean => {
    if (n < 80) return false;
    const op = inView.getUint32(4, true);
    if (op !== OP_READ && op !== OP_WRITE) return false;
    if (inView.getUint32(16, true) !== FILE_INO || inView.getUint32(20, true) !== 0) return false;
    if (op === OP_WRITE && d.writeFd < 0) return false;
    // u64 offset; anything at or above 2^53 is past every image anyway
    const hi = inView.getUint32(52, true);
    const offset = hi >= 0x200000 ? Number.MAX_SAFE_INTEGER : hi * 4294967296 + inView.getUint32(48, true);
    const size = inView.getUint32(56, true);
    if (op === OP_READ) {
      const len = Math.max(0, Math.min(size, d.size - offset, bufSize));
      const end = offset + len;
      const dirty = d.dirty;
      if (dirty && len > 0) {
        for (let b = Math.floor(offset / 4096), last = Math.floor((end - 1) / 4096); b <= last; b++) {
          if ((Atomics.load(dirty, b >>> 5) & (1 << (b & 31))) !== 0) return false;
        }
      }
      const ext = d.ext;
      const count = ext.length / 4;
      let done = 0;
      try {
        // first extent ending after `offset`
        let lo = 0, hi = count;
        while (lo < hi) {
          const mid = (lo + hi) >>> 1;
          if (ext[mid * 4]! + ext[mid * 4 + 1]! <= offset) lo = mid + 1;
          else hi = mid;
        }
        let pos = offset;
        for (let i = lo; pos < end; i++) {
          const start = i < count ? ext[i * 4]! : end;
          if (start >= end) {
            out.fill(0, DATA + pos - offset, DATA + len);
            pos = end;
            break;
          }
          if (start > pos) {
            out.fill(0, DATA + pos - offset, DATA + start - offset);
            pos = start;
          }
          const stop = Math.min(start + ext[i * 4 + 1]!, end);
          const efd = ext[i * 4 + 2]!, foff = ext[i * 4 + 3]! + (pos - start);
          let got = 0;
          while (pos + got < stop) {
            const r = fs.readSync(efd, out, DATA + pos - offset + got, stop - pos - got, foff + got);
            if (r === 0) break;
            got += r;
          }
          if (pos + got < stop) {
            if (!d.zeroFill) {
              pos += got;
              break;
            }
            out.fill(0, DATA + pos - offset + got, DATA + stop - offset);
          }
          pos = stop;
        }
        done = pos - offset;
      } catch (e) {
        port.postMessage({ fail: String(e), op: "read", offset, size });
        reply(0, EIO);
        return true;
      }
      if (len > 0) {
        d.counters[c]! += 1;
        d.counters[c + 1]! += done;
      }
      reply(done, 0);
      return true;
    }
    const reqLen = inView.getUint32(0, true);
    if (Math.min(reqLen, n) - 80 < size) {
      reply(0, EINVAL);
      return true;
    }
    if (offset + size > d.size) {
      reply(0, ENOSPC);
      return true;
    }
    let done = 0;
    try {
      while (done < size) done += fs.writeSync(d.writeFd, buf, 80 + done, size - done, offset + done);
    } catch (e) {
      port.postMessage({ fail: String(e), op: "write", offset, size });
      reply(0, EIO);
      return true;
    }
    d.counters[c + 2]! += 1;
    d.counters[c + 3]! += size;
    outView.setUint32(DATA, size, true);
    outView.setUint32(DATA + 4, 0, true);
    reply(8, 0);
    return true;
  };

  for (;;) {
    let n: number;
    try {
      n = fs.readSync(fd, buf, 0, bufSize, null);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      // ENOENT: the request was interrupted before we read it; EINTR/EAGAIN: retry.
      if (code === "ENOENT" || code === "EINTR" || code === "EAGAIN") continue;
      port.postMessage({ done: code ?? String(e) });
      return;
    }
    if (n === 0) {
      port.postMessage({ done: "EOF" });
      return;
    }
    if (direct) {
      // announce first, then check the flag: close() sets the flag, then waits for the count
      // to drop to 0, so it never closes the file under a direct request (both sequentially
      // consistent atomics)
      Atomics.add(direct.ctl, 1, 1);
      let served = false;
      try {
        if (Atomics.load(direct.ctl, 0) === 0) served = serveDirect(direct, n);
      } finally {
        Atomics.sub(direct.ctl, 1, 1);
      }
      if (served) continue;
    }
    const req = buf.slice(0, n);
    port.postMessage(req.buffer, [req.buffer]);
  }
}

/** Source text for `new Worker(readerSource(), { eval: true, workerData })`. */
export function readerSource(): string {
  return `(${readerLoop.toString()})(require("node:fs"), require("node:worker_threads"));`;
}
