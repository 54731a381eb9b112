/**
 * Entry module of the thread `waitExit` (./pidfd.ts) starts for one wait (see src/bundle.ts):
 * blocks in poll(2) on the pidfd `workerData.fd` for at most `workerData.timeoutMs`, posts the
 * result of `pollReadable` (1 exited, 0 timed out, or a negative errno) and ends.
 */
import { parentPort, workerData } from "node:worker_threads";
import { pollReadable } from "./pidfd.ts";

const EINVAL = 22;
const d = workerData as { fd?: unknown; timeoutMs?: unknown } | null;
// always one answer: the waiting side listens for nothing else
parentPort?.postMessage(typeof d?.fd === "number" && typeof d.timeoutMs === "number" ? pollReadable(d.fd, d.timeoutMs) : -EINVAL);
