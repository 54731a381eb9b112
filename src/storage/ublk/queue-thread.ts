/**
 * One queue of a ublk device as the device (device.ts, on the main thread) drives it: the
 * queue's descriptor and I/O buffer mappings, its mailbox and doorbell, and its thread
 * (queue-worker.ts) with the promises that tell where it is: loaded (waiting for its
 * QueueCommand), ready (every tag fetched), exited. Started, stopped and released here.
 */
import { Worker } from "node:worker_threads";
import { workerEntry } from "../../bundle.ts";
import { closeEventfd, createEventfd, signalEventfd } from "../../ffi/eventfd.ts";
import { mapMemory, MAP_POPULATE, MAP_SHARED, PROT_READ, unmapMemory, type Mapping } from "../../ffi/mmap.ts";
import { ioDescMapping } from "../../ffi/ublk.ts";
import { logger } from "../../observability/log.ts";
import { orLate } from "../../util/timeout.ts";
import { UblkError } from "./errors.ts";
import { MAILBOX_STOP, mailboxPut, nextPow2, QUEUE_COUNTER_SLOTS, type QueueCommand, type QueueMessage, type QueueSetup } from "./queue.ts";

const log = logger("ublk");

/** A request a queue thread forwards to the main thread: `[tag, op, flags, offset, length]`. */
export type ForwardedRequest = [number, number, number, number, number];

/** A started queue thread and what it shares with the main thread. */
export interface QueueThread {
  worker: Worker;
  /** The thread was sent its QueueCommand. */
  commanded: boolean;
  loaded: Promise<void>;
  ready: Promise<void>;
  desc: Mapping;
  arena: Mapping;
  /** The I/O buffers, `maxIoBytes` per tag. */
  bufs: Uint8Array;
  mailbox: Int32Array;
  cap: number;
  counters: Float64Array;
  doorbell: number;
  /** Resolves with why the thread ended ("exited" when it did not say). */
  exited: Promise<string>;
}

/** Which queue of which device, and its shape. */
export interface QueueThreadSpec {
  devId: number;
  q: number;
  depth: number;
  /** Bytes of one tag's I/O buffer. */
  maxIoBytes: number;
  /** The device's open /dev/ublkcN. */
  charFd: number;
  encodedOps: boolean;
}

/**
 * Map queue `spec.q`'s descriptors and buffers and start its thread; `onRequest` gets each
 * request the thread forwards. `loaded` and `ready` reject if the thread crashes or ends first.
 * @throws what mmap throws (nothing is left mapped then)
 */
export function startQueueThread(spec: QueueThreadSpec, onRequest: (msg: ForwardedRequest) => void): QueueThread {
  const { devId, q, depth, maxIoBytes: maxIo } = spec;
  const m = ioDescMapping(q, depth);
  const desc = mapMemory(m.length, { fd: spec.charFd, offset: m.offset, prot: PROT_READ, flags: MAP_SHARED | MAP_POPULATE });
  let arena: Mapping;
  try {
    arena = mapMemory(depth * maxIo);
  } catch (e) {
    unmapMemory(desc);
    throw e;
  }
  const cap = nextPow2(depth + 2);
  const mailbox = new Int32Array(new SharedArrayBuffer(4 * (2 + 2 * cap)));
  const doorbell = createEventfd();
  const counters = new Float64Array(new SharedArrayBuffer(8 * QUEUE_COUNTER_SLOTS));
  const setup: QueueSetup = {
    devId, qId: q, depth, maxIoBytes: maxIo, charFd: spec.charFd, descPtr: desc.ptr, descLength: desc.length, bufPtr: arena.ptr,
    encodedOps: spec.encodedOps, mailbox: mailbox.buffer as SharedArrayBuffer, mailboxCap: cap, doorbellFd: doorbell, ringFlags: 0,
    counters: counters.buffer as SharedArrayBuffer,
  };
  const worker = new Worker(workerEntry("storage/ublk/queue-worker.ts"), { workerData: setup });
  const loaded = Promise.withResolvers<void>();
  const ready = Promise.withResolvers<void>();
  // a start that fails early leaves these unawaited: never an unhandled rejection
  loaded.promise.catch(() => undefined);
  ready.promise.catch(() => undefined);
  const fail = (e: Error) => {
    loaded.reject(e);
    ready.reject(e);
  };
  const exited = new Promise<string>((resolve) => {
    let reason = "";
    worker.on("message", (msg: QueueMessage) => {
      if (Array.isArray(msg)) return onRequest(msg as ForwardedRequest);
      if (msg.type === "loaded") loaded.resolve();
      else if (msg.type === "ready") ready.resolve();
      else if (msg.type === "exit") reason = msg.reason;
    });
    worker.on("error", (e: Error) => {
      reason ||= `queue ${q} thread crashed: ${e.message}`;
      log.error({ devId, queue: q, err: e.message }, "queue thread crashed");
      fail(e);
    });
    worker.on("exit", () => {
      fail(new UblkError("ublk.queue_failed", `queue ${q} of device ${devId} ended before it was ready: ${reason}`, { devId, queue: q, reason }));
      resolve(reason || "exited");
    });
  });
  return { worker, commanded: false, loaded: loaded.promise, ready: ready.promise, desc, arena, bufs: new Uint8Array(arena.buffer, 0, depth * maxIo), mailbox, cap, counters, doorbell, exited };
}

/**
 * Wait for queue threads to end: threads still waiting for their command are told to stop at
 * once; past `waitMs` every thread is told through its mailbox, and past `forceMs` more the
 * threads still running are terminated.
 */
export async function stopQueueThreads(queues: readonly QueueThread[], waitMs: number, forceMs: number, devId: number): Promise<void> {
  for (const q of queues) {
    if (q.commanded) continue;
    q.commanded = true;
    q.worker.postMessage({ type: "stop" } satisfies QueueCommand);
  }
  const all = Promise.all(queues.map((q) => q.exited));
  const late = waitMs <= 0 || (await orLate(all.then(() => false), waitMs, true));
  if (!late) return;
  if (waitMs > 0) log.warn({ devId, waitMs }, "queue threads did not end after STOP_DEV: stopping them");
  for (const q of queues) {
    mailboxPut(q.mailbox, q.cap, MAILBOX_STOP, 0);
    signalEventfd(q.doorbell);
  }
  const stopped = await orLate(all.then(() => true), forceMs, false);
  if (!stopped) for (const q of queues) await q.worker.terminate();
}

/** Unmap a queue's memory and close its doorbell, once its thread has ended. */
export function releaseQueueThread(q: QueueThread): void {
  unmapMemory(q.desc);
  unmapMemory(q.arena);
  closeEventfd(q.doorbell);
}
