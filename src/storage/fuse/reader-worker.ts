/**
 * Body of a reader thread: blocks in read(2) on /dev/fuse and hands each request (one read = one
 * request) to the main thread, which owns the BlockImage and writes the reply. Blocking reads
 * must live off the main thread: a parked read would stall the event loop.
 *
 * The thread is started with `eval: true` from this function's source text (see `readerSource`),
 * so it also runs from a `bun build --compile` binary, which embeds no separate worker file. The
 * function must therefore use nothing but its parameters.
 * workerData: { fd: number, bufSize: number }. Messages out: ArrayBuffer (a request), or
 * { done: string } when the connection ends (ENODEV after unmount, ECONNABORTED after abort).
 */
import type * as Fs from "node:fs";
import type * as WorkerThreads from "node:worker_threads";

function readerLoop(fs: typeof Fs, wt: typeof WorkerThreads): void {
  const { fd, bufSize } = wt.workerData as { fd: number; bufSize: number };
  const port = wt.parentPort!;
  const buf = new Uint8Array(bufSize);
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
    const req = buf.slice(0, n);
    port.postMessage(req.buffer, [req.buffer]);
  }
}

/** Source text for `new Worker(readerSource(), { eval: true, workerData })`. */
export function readerSource(): string {
  return `(${readerLoop.toString()})(require("node:fs"), require("node:worker_threads"));`;
}
