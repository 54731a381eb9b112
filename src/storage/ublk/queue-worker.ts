/**
 * Entry module of a ublk queue thread (`new Worker(workerEntry("storage/ublk/queue-worker.ts"))`,
 * see src/bundle.ts): serves the queue described by `workerData` (a `QueueInit`) until it ends,
 * then reports `{ type: "exit", reason }` and returns.
 */
import { parentPort, workerData } from "node:worker_threads";
import { runQueue, type QueueInit, type QueueMessage } from "./queue.ts";

if (parentPort && workerData) {
  const port = parentPort;
  const post = (m: QueueMessage) => port.postMessage(m);
  const reason = runQueue(workerData as QueueInit, post);
  post({ type: "exit", reason });
  port.close();
}
