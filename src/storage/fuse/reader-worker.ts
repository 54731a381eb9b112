/**
 * Worker thread that blocks in read(2) on /dev/fuse and hands each request (one read = one
 * request) to the main thread, which owns the BlockImage and writes the reply. Blocking reads
 * must live off the main thread: a parked read would stall the event loop.
 * workerData: { fd: number, bufSize: number }. Messages out: ArrayBuffer (a request), or
 * { done: string } when the connection ends (ENODEV after unmount, ECONNABORTED after abort).
 */
import { readSync } from "node:fs";
import { parentPort, workerData } from "node:worker_threads";

const { fd, bufSize } = workerData as { fd: number; bufSize: number };
const buf = new Uint8Array(bufSize);

for (;;) {
  let n: number;
  try {
    n = readSync(fd, buf, 0, bufSize, null);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    // ENOENT: the request was interrupted before we read it; EINTR/EAGAIN: retry.
    if (code === "ENOENT" || code === "EINTR" || code === "EAGAIN") continue;
    parentPort!.postMessage({ done: code ?? String(e) });
    break;
  }
  if (n === 0) {
    parentPort!.postMessage({ done: "EOF" });
    break;
  }
  const req = buf.slice(0, n);
  parentPort!.postMessage(req.buffer, [req.buffer]);
}
