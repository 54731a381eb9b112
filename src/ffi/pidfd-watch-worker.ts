/**
 * Entry module of the one thread that watches held processes (./pidfd-watch.ts, see
 * src/bundle.ts): blocks in epoll_wait(2) on `workerData.epfd`, posts the token of every pidfd
 * that became readable (its process exited; each is armed EPOLLONESHOT, so it reports once) and
 * ends when the wake eventfd (token WAKE_TOKEN) fires.
 */
import { parentPort, workerData } from "node:worker_threads";
import { EPOLL_EVENT_SIZE, Errno, epollWait, eventData } from "./epoll.ts";

/** The wake eventfd's token (WAKE_TOKEN of ./pidfd-watch.ts). */
const WAKE_TOKEN = 0;
const MAX_EVENTS = 64;
const epfd = (workerData as { epfd?: unknown } | null)?.epfd;
if (typeof epfd === "number") {
  const buf = new Uint8Array(MAX_EVENTS * EPOLL_EVENT_SIZE);
  const view = new DataView(buf.buffer);
  let running = true;
  while (running) {
    const n = epollWait(epfd, buf, -1);
    if (n === -Errno.EINTR) continue;
    if (n < 0) break; // the set is gone: nothing left to watch
    for (let i = 0; i < n; i++) {
      const token = eventData(view, i);
      if (token === WAKE_TOKEN) running = false;
      else parentPort?.postMessage(token);
    }
  }
}
