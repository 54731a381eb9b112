/**
 * The reader threads of a process that serves FUSE connections: a fixed number of worker
 * threads (./reader-worker.ts) shared by every connection, each parked in epoll on all their
 * /dev/fuse fds. Connections register here; requests the threads do not answer themselves come
 * back to the connection's `onRequest` on the main thread. One pool per process: its thread
 * count, not the number of disks, bounds the threads and buffers (about 2 × max_write each).
 */
import { Worker } from "node:worker_threads";
import { MessageChannel, type MessagePort } from "node:worker_threads";
import { closeSync } from "node:fs";
import { epollAdd, epollCreate, epollDel, EPOLLEXCLUSIVE, EPOLLIN, setNonBlocking } from "../../ffi/epoll.ts";
import { createEventfd, signalEventfd } from "../../ffi/eventfd.ts";
import { logger } from "../../observability/log.ts";
import { workerEntry } from "../../bundle.ts";
import { FuseError } from "./errors.ts";
import type { ControlMsg, DirectMsg } from "./reader-worker.ts";

const log = logger("fuse");

/** What a registered connection receives from the pool (all on the main thread). */
export interface PoolClient {
  /** A request the threads handed on (one whole request, its own buffer). */
  onRequest(req: Uint8Array): void;
  /** The kernel ended the connection (ENODEV after unmount, ECONNABORTED after abort). Called once. */
  onEnded(reason: string): void;
  /** A direct read or write failed and was answered EIO. */
  onDirectFailure(info: { op: string; offset: number; size: number; error: string }): void;
}

/** Counters per reader thread in a connection's `counters` array. */
export const COUNTERS_PER_THREAD = 6;

interface Slot {
  fd: number;
  client: PoolClient;
  ended: boolean;
  acks: number;
  acked?: () => void;
}

interface Thread {
  worker: Worker;
  port: MessagePort;
  epfd: number;
  wakeFd: number;
  exited: Promise<void>;
}

/** Options of a pool. */
export interface ReaderPoolOptions {
  /** Reader threads (1..16). */
  threads: number;
  /** Largest request in bytes (max_write + 4096, at least 8192: FUSE_MIN_READ_BUFFER). */
  bufSize: number;
  /** Answer large READs with splice(2) (default true). */
  splice?: boolean;
}

/** A fixed set of reader threads serving any number of FUSE connections. */
export class FuseReaderPool {
  readonly threads: number;
  #threads: Thread[] = [];
  #slots = new Map<number, Slot>();
  #nextSlot = 1;
  #closed = false;

  /**
   * Start the threads.
   * @throws FuseError `fuse.bad_options` for a thread count outside 1..16
   */
  constructor(opts: ReaderPoolOptions) {
    if (!Number.isInteger(opts.threads) || opts.threads < 1 || opts.threads > 16) {
      throw new FuseError("fuse.bad_options", `reader threads must be 1..16, got ${opts.threads}`, { threads: opts.threads });
    }
    this.threads = opts.threads;
    for (let index = 0; index < opts.threads; index++) {
      const epfd = epollCreate();
      const wakeFd = createEventfd({ nonBlocking: true });
      epollAdd(epfd, wakeFd, EPOLLIN, 0);
      const { port1, port2 } = new MessageChannel();
      const worker = new Worker(workerEntry("storage/fuse/reader-worker.ts"), {
        workerData: { index, epfd, wakeFd, port: port2, bufSize: opts.bufSize, splice: opts.splice ?? true },
        transferList: [port2],
      });
      worker.on("message", (m) => this.#onMessage(m));
      worker.on("error", (e) => log.error({ err: e, thread: index }, "fuse reader thread failed"));
      const exited = new Promise<void>((r) => worker.once("exit", () => r()));
      this.#threads.push({ worker, port: port1, epfd, wakeFd, exited });
    }
  }

  /** Connections currently registered. */
  get size(): number {
    return this.#slots.size;
  }

  /**
   * Serve `fd` (a /dev/fuse connection; set non-blocking here, which every dup of it shares).
   * @param direct where the served file's bytes live for direct answers (null: every request goes to `client`)
   * @param ctl shared [closing, in-progress] pair (Int32Array over a SharedArrayBuffer, 2 entries)
   * @param counters shared per-thread counters (`threads * COUNTERS_PER_THREAD` entries)
   * @returns the slot number naming this connection in `update`/`unregister`
   * @throws FuseError `fuse.closed` after `close()`
   */
  register(fd: number, client: PoolClient, direct: DirectMsg | null, ctl: Int32Array, counters: Float64Array): number {
    if (this.#closed) throw new FuseError("fuse.closed", "the reader pool is closed", { fd });
    setNonBlocking(fd);
    const slot = this.#nextSlot++;
    this.#slots.set(slot, { fd, client, ended: false, acks: 0 });
    // post first, then watch: a thread that sees the fd before the message drains its port
    this.#post({ op: "add", slot, fd, direct, ctl, counters });
    // exclusive: a request wakes one thread, not every thread parked on the connection
    for (const t of this.#threads) {
      const rc = epollAdd(t.epfd, fd, EPOLLIN | EPOLLEXCLUSIVE, slot);
      if (rc < 0) throw new FuseError("fuse.bad_options", `cannot watch /dev/fuse fd ${fd}: errno ${-rc}`, { fd, errno: -rc });
    }
    return slot;
  }

  /** Replace the direct plan of a connection (threads pick it up at their next wake-up). */
  update(slot: number, direct: DirectMsg | null): void {
    if (!this.#slots.has(slot)) return;
    this.#post({ op: "update", slot, direct });
  }

  /**
   * Stop serving a connection: no thread reads its fd once this resolves (the caller may then
   * close it). Requests already handed to the client are the client's to finish.
   */
  async unregister(slot: number): Promise<void> {
    const s = this.#slots.get(slot);
    if (!s) return;
    for (const t of this.#threads) epollDel(t.epfd, s.fd);
    const acked = new Promise<void>((r) => (s.acked = r));
    this.#post({ op: "remove", slot });
    await acked;
    this.#slots.delete(slot);
  }

  /** Stop every thread (after unregistering what is left). Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const slot of [...this.#slots.keys()]) await this.unregister(slot);
    this.#post({ op: "stop" });
    await Promise.all(this.#threads.map((t) => t.exited));
    for (const t of this.#threads) {
      closeSync(t.epfd);
      closeSync(t.wakeFd);
      t.port.close();
    }
  }

  #post(msg: ControlMsg): void {
    for (const t of this.#threads) {
      t.port.postMessage(msg);
      signalEventfd(t.wakeFd);
    }
  }

  #onMessage(m: { slot?: number; req?: ArrayBuffer; ended?: string; removed?: number; fail?: string; op?: string; offset?: number; size?: number; warn?: string }): void {
    if (m.warn !== undefined) {
      log.warn({ err: m.warn }, "fuse reader thread");
      return;
    }
    const s = m.slot === undefined ? undefined : this.#slots.get(m.slot);
    if (!s) return;
    if (m.req !== undefined) s.client.onRequest(new Uint8Array(m.req));
    else if (m.removed !== undefined) {
      if (++s.acks === this.#threads.length) s.acked?.();
    } else if (m.ended !== undefined) {
      if (!s.ended) {
        s.ended = true;
        s.client.onEnded(m.ended);
      }
    } else if (m.fail !== undefined) s.client.onDirectFailure({ op: m.op ?? "?", offset: m.offset ?? -1, size: m.size ?? 0, error: m.fail });
  }
}
