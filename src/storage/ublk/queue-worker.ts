/**
 * Entry module of a ublk queue thread (`new Worker(workerEntry("storage/ublk/queue-worker.ts"))`,
 * see src/bundle.ts). `workerData` is a `QueueSetup`; the thread reports `{ type: "loaded" }` and
 * waits for one `QueueCommand`: `serve` runs the queue until it ends, `stop` ends at once. Either
 * way it reports `{ type: "exit", reason }` and returns.
 */
import { parentPort, workerData } from "node:worker_threads";
import { runQueue, type QueueCommand, type QueueMessage, type QueueSetup } from "./queue.ts";

if (parentPort && workerData) {
  const port = parentPort;
  const post = (m: QueueMessage) => port.postMessage(m);
  port.once("message", (cmd: QueueCommand) => {
    const reason = cmd.type === "serve" ? runQueue({ ...(workerData as QueueSetup), size: cmd.size, readOnly: cmd.readOnly, plan: cmd.plan, divert: cmd.divert }, post) : "stopped before serving";
    post({ type: "exit", reason });
    port.close();
  });
  post({ type: "loaded" });
}
