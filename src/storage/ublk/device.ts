/**
 * One ublk device served by this process: create (ADD_DEV, queue threads started, SET_PARAMS,
 * tags fetched, START_DEV), or pre-create it without a target (ADD_DEV and the queue threads
 * only: a warm pool) and `bind` a target later (SET_PARAMS with the target's size, fetch,
 * START_DEV; the kernel takes parameters any time before START_DEV); take over after the
 * previous server died (START_USER_RECOVERY, queue threads, END_USER_RECOVERY); answer the
 * requests the queue threads forward (through the target's BlockImage, writes serialised); and
 * stop (STOP_DEV, threads drain and exit, DEL_DEV).
 * Sequence and pitfalls: ../shared/docs/ublk-iouring-firecracker.md §1.8–1.11.
 */
import { closeSync, openSync } from "node:fs";
import { signalEventfd } from "../../ffi/eventfd.ts";
import {
  encodeParams, UBLK_ATTR, UBLK_CMD, UBLK_DEV_ID_ANY, UBLK_F, UBLK_IO_OP, UBLK_S_DEV, ublkBlockPath, ublkCharPath, type DevInfo,
} from "../../ffi/ublk.ts";
import { logger } from "../../observability/log.ts";
import type { UblkConfig } from "./config.ts";
import { errnoName, type UblkControl } from "./control.ts";
import { UblkError } from "./errors.ts";
import { markDiverted, newDivertMap } from "./plan.ts";
import { RequestOrder } from "./order.ts";
import { mailboxPut, QUEUE_COUNTERS, type QueueCommand } from "./queue.ts";
import type { UblkTarget } from "./targets.ts";
import { withTimeout } from "../../util/timeout.ts";
import { processAlive } from "../../ffi/proc.ts";
import { retryUntil } from "../../util/retry.ts";
import { errorCode, errorMessage } from "../../util/error.ts";
import { AgentEnvError } from "../../errors.ts";
import { releaseQueueThread, startQueueThread, stopQueueThreads, type ForwardedRequest, type QueueThread } from "./queue-thread.ts";

const log = logger("ublk");
const O_RDWR = 2, O_CLOEXEC = 0o2000000;
const EIO = 5, ENOSPC = 28, EBUSY = 16;
/** Pause between checks while waiting for a dead server's device to become recoverable, ms. */
const RECOVERY_POLL_MS = 200;

/**
 * Device lifecycle states (see `UblkDevice.state`): `pooled` (added, queue threads waiting, no
 * target, no block device yet), `starting`, `live`, `stopping`, `stopped` (removed), `detached`
 * (left to another server), `failed` (every queue stopped on its own, or a start failed).
 */
export type DeviceState = "pooled" | "starting" | "live" | "stopping" | "stopped" | "detached" | "failed";

/**
 * How long each step of making a device took, ms (0 for a step not taken). `add`: ADD_DEV;
 * `open`: opening /dev/ublkcN and mapping descriptors and buffers; `threads`: queue threads
 * started until each reported loaded; `params`: SET_PARAMS; `fetch`: until every tag was fetched;
 * `start`: START_DEV (or END_USER_RECOVERY). A pre-created device spends the first three before
 * it has a target, the last three when it is bound.
 */
export interface DeviceTimings {
  addMs: number;
  openMs: number;
  threadsMs: number;
  paramsMs: number;
  fetchMs: number;
  startMs: number;
}

/** Requests a device answered since it started (by this server), and their bytes. */
export interface DeviceStats {
  reads: number;
  bytesRead: number;
  writes: number;
  bytesWritten: number;
  flushes: number;
  /** DISCARD and WRITE_ZEROES requests. */
  discards: number;
  /** Requests answered with an error. */
  errors: number;
  /** Requests the queue threads handed to the main thread (the image) instead of answering them. */
  forwarded: number;
  /** io_uring_enter calls the queue threads waited in (requests / enters: how much each wake-up batched). */
  enters: number;
}

/** Per-device choices (defaults from `[ublk]`). */
export interface DeviceOptions {
  /** Wanted device id; default: the kernel picks. */
  devId?: number;
  /** Override `[ublk] user_recovery` for this device. */
  userRecovery?: boolean;
  /**
   * Stored by the kernel in the device's `ublksrv_flags` (opaque to it; GET_DEV_INFO returns it):
   * tells the devices of one owner (a disk daemon) from everyone else's. Default 0.
   */
  ownerTag?: bigint;
}

/** Errno for a failed image operation: ENOSPC passes through, everything else is EIO. */
function errnoOf(e: unknown): number {
  const code = (e as { code?: string; details?: { errno?: string } }).details?.errno ?? (e as { code?: string }).code;
  return code === "ENOSPC" ? ENOSPC : EIO;
}

/**
 * A ublk device served by this process. Obtain with `create`, `precreate` (+ `bind`) or
 * `recover`; `close()` removes it. The device owns its target's image and closes it.
 */
export class UblkDevice {
  readonly devId: number;
  /** `/dev/ublkbN`: the block device a VMM opens (it exists once the device is live). */
  readonly blockPath: string;
  /** `/dev/ublkcN`. */
  readonly charPath: string;
  /** The kernel's view after ADD_DEV / GET_DEV_INFO (queues, depth, buffer size, accepted flags). */
  readonly info: DevInfo;
  /** Resolves when every queue thread has stopped, with the first reason. */
  readonly ended: Promise<string>;
  /** Time spent in each step of making this device (see DeviceTimings). */
  readonly timings: DeviceTimings = { addMs: 0, openMs: 0, threadsMs: 0, paramsMs: 0, fetchMs: 0, startMs: 0 };
  #state: DeviceState = "starting";
  #ctrl: UblkControl;
  #cfg: UblkConfig;
  #encodedOps: boolean;
  #target: UblkTarget | null = null;
  #size = 0;
  #charFd = -1;
  #queues: QueueThread[] = [];
  #divert: Int32Array | null = null;
  /** Order of the requests the main thread answers (serial writes, exclusive operations). */
  #order = new RequestOrder();
  #closing: Promise<void> | null = null;
  #resolveEnded!: (r: string) => void;
  #forwarded = 0;
  /** Added by `create` for its target (not taken from a pool). */
  #fresh = false;

  private constructor(ctrl: UblkControl, cfg: UblkConfig, info: DevInfo, encodedOps: boolean, target: UblkTarget | null) {
    this.#ctrl = ctrl;
    this.#cfg = cfg;
    this.#encodedOps = encodedOps;
    this.info = info;
    this.devId = info.devId;
    this.blockPath = ublkBlockPath(info.devId);
    this.charPath = ublkCharPath(info.devId);
    if (target) this.#setTarget(target);
    this.ended = new Promise((r) => (this.#resolveEnded = r));
  }

  #setTarget(target: UblkTarget): void {
    this.#target = target;
    this.#size = target.image.size;
    const p = target.plan;
    // reads of what the main thread writes (an overlaybd upper) must not come from the plan
    this.#divert = p?.kind === "extents" && p.writeFile < 0 && (!target.image.readOnly || p.diverted.length > 0) ? newDivertMap(this.#size) : null;
    if (this.#divert && p?.kind === "extents") for (const [a, b] of p.diverted) markDiverted(this.#divert, a, b - a);
  }

  /**
   * What the device serves.
   * @throws UblkError `ublk.bad_state` for a pre-created device not bound yet
   */
  get target(): UblkTarget {
    if (!this.#target) throw new UblkError("ublk.bad_state", `device ${this.devId} is pre-created and has no target yet`, { devId: this.devId, state: this.#state });
    return this.#target;
  }

  /** True once the device has a target (created, bound or recovered). */
  get bound(): boolean {
    return this.#target !== null;
  }

  /** Size in bytes (0 while pre-created). */
  get size(): number {
    return this.#size;
  }

  /** Lifecycle state. */
  get state(): DeviceState {
    return this.#state;
  }

  /** The owner tag this device was added with (`DeviceOptions.ownerTag`). */
  get ownerTag(): bigint {
    return this.info.ublksrvFlags;
  }

  /** True when the kernel accepted user recovery for this device. */
  get recoverable(): boolean {
    return (this.info.flags & UBLK_F.USER_RECOVERY) !== 0n;
  }

  /** Requests answered so far, summed over the queues (counted by the queue threads as they commit). */
  stats(): DeviceStats {
    const sum = (k: keyof typeof QUEUE_COUNTERS) => this.#queues.reduce((n, q) => n + q.counters[QUEUE_COUNTERS[k]]!, 0);
    return {
      reads: sum("reads"), bytesRead: sum("bytesRead"), writes: sum("writes"), bytesWritten: sum("bytesWritten"),
      flushes: sum("flushes"), discards: sum("discards"), errors: sum("errors"), forwarded: this.#forwarded, enters: sum("enters"),
    };
  }

  /**
   * Run `op` while no request changes or reads the image through the main thread (e.g. a restack
   * of the overlaybd stack): it starts once the requests forwarded before it are answered, and
   * requests forwarded meanwhile wait until it ends (see RequestOrder). Reads the queue threads
   * answer from read-only layer files go on (a restack leaves those files as they are).
   * @returns what `op` returns; its error is rethrown
   */
  exclusive<T>(op: () => Promise<T>): Promise<T> {
    return this.#order.exclusive(op);
  }

  /** Open the char device (close-on-exec: a child must never hold it, or DEL_DEV and recovery wait on it). */
  async #openChar(waitMs: number): Promise<void> {
    try {
      this.#charFd = await retryUntil(() => openSync(this.charPath, O_RDWR | O_CLOEXEC), {
        timeoutMs: waitMs,
        intervalMs: RECOVERY_POLL_MS / 10,
        // devtmpfs makes the node as the device is added; EBUSY: the old server still holds it
        retryable: (e) => errorCode(e) === "ENOENT" || errorCode(e) === "EBUSY",
      });
    } catch (e) {
      throw new UblkError("ublk.queue_failed", `cannot open ${this.charPath}: ${errorMessage(e)}`, { devId: this.devId, path: this.charPath, code: errorCode(e) });
    }
  }

  /**
   * Map each queue's descriptors and buffers and start its thread; resolves once every thread is
   * loaded and waits for its QueueCommand (nothing is fetched yet).
   */
  async #spawnQueues(timeoutMs: number): Promise<void> {
    const { nrHwQueues, queueDepth: depth, maxIoBufBytes: maxIo } = this.info;
    for (let q = 0; q < nrHwQueues; q++) {
      const spec = { devId: this.devId, q, depth, maxIoBytes: maxIo, charFd: this.#charFd, encodedOps: this.#encodedOps };
      this.#queues.push(startQueueThread(spec, (msg) => this.#serve(q, msg)));
    }
    void Promise.all(this.#queues.map((q) => q.exited)).then((reasons) => {
      if (this.#state === "live" || this.#state === "starting") {
        this.#state = "failed";
        log.error({ devId: this.devId, reasons }, "every queue of the device stopped while it was live");
      }
      this.#resolveEnded(reasons.find((r) => r) ?? "exited");
    });
    await withTimeout(Promise.all(this.#queues.map((q) => q.loaded)), timeoutMs, () => new UblkError("ublk.timeout", `queue threads of device ${this.devId} not started within ${timeoutMs} ms`, { devId: this.devId, timeoutMs }));
  }

  /** Tell every (loaded) queue thread what to serve; resolves once every tag is fetched. */
  async #serveQueues(timeoutMs: number): Promise<void> {
    const cmd: QueueCommand = { type: "serve", size: this.#size, readOnly: this.target.image.readOnly, plan: this.target.plan, divert: this.#divert };
    for (const q of this.#queues) {
      q.commanded = true;
      q.worker.postMessage(cmd);
    }
    await withTimeout(Promise.all(this.#queues.map((q) => q.ready)), timeoutMs, () => new UblkError("ublk.timeout", `queues of device ${this.devId} not ready within ${timeoutMs} ms`, { devId: this.devId, timeoutMs }));
  }

  /** Answer a request a queue thread forwarded: `[tag, op, flags, offset, length]`. */
  #serve(q: number, msg: ForwardedRequest): void {
    this.#order.admit(() => this.#answer(q, msg));
  }

  /** Answer one forwarded request through the image; resolves once its result is in the mailbox. */
  #answer(q: number, [tag, op, , offset, length]: ForwardedRequest): Promise<void> {
    this.#forwarded++;
    const queue = this.#queues[q]!;
    const maxIo = this.info.maxIoBufBytes;
    const buf = queue.bufs.subarray(tag * maxIo, tag * maxIo + length);
    const img = this.target.image;
    const done = (result: number) => {
      mailboxPut(queue.mailbox, queue.cap, tag, result);
      signalEventfd(queue.doorbell);
    };
    const failed = (e: unknown) => {
      const details = e instanceof AgentEnvError ? e.details : {};
      log.error({ devId: this.devId, queue: q, tag, op, offset, length, code: errorCode(e), file: details.file, fileOffset: details.offset, err: errorMessage(e) }, `request failed: ${errorMessage(e)}`);
      done(-errnoOf(e));
    };
    let work: Promise<number>;
    switch (op) {
      case UBLK_IO_OP.READ:
        work = img.pread(buf, offset).then((n) => (n === length ? n : Promise.reject(new UblkError("ublk.io_failed", `short read at ${offset}: ${n} of ${length} bytes`, { offset, length }))));
        break;
      case UBLK_IO_OP.WRITE:
        if (this.#divert) markDiverted(this.#divert, offset, length);
        work = this.#order.serial(() => img.pwrite(buf, offset));
        break;
      case UBLK_IO_OP.FLUSH:
        work = this.#order.serial(() => img.sync().then(() => 0));
        break;
      case UBLK_IO_OP.DISCARD:
      case UBLK_IO_OP.WRITE_ZEROES:
        if (this.#divert) markDiverted(this.#divert, offset, length);
        work = this.#order.serial(() => img.discard(offset, length).then(() => 0));
        break;
      default:
        done(-95);
        return Promise.resolve();
    }
    return work.then(done, failed);
  }

  /**
   * Stop serving and remove the device: STOP_DEV (the block device goes away after the requests
   * in flight are answered; the queue threads then see every tag aborted and end), release the
   * char device and mappings, DEL_DEV, close the target. Idempotent.
   * @throws UblkError `ublk.control_failed` / `ublk.timeout` when the kernel refuses (the rest is
   * still released)
   */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  /**
   * Stop serving but leave the device to another server (a restarted daemon calls `recover`):
   * the queue threads end with their tags still parked, the char device and buffers are
   * released, the image is synced and closed. The kernel notices the threads are gone (6.1:
   * within about 5 s); with user recovery it then holds new requests (and re-issues those this
   * server had not answered) until `recover`, without it it removes the block device.
   * Idempotent; a device being closed is not detached.
   */
  detach(): Promise<void> {
    this.#closing ??= this.#detach();
    return this.#closing;
  }

  async #detach(): Promise<void> {
    if (!this.#target) return this.#close(); // a pre-created device has nothing to recover
    this.#state = "stopping";
    await this.#stopQueues(0);
    await this.#order.idle();
    this.#release();
    try {
      await this.#target.image.sync();
    } finally {
      await this.#target.image.close();
    }
    this.#state = "detached";
    log.info({ devId: this.devId, recoverable: this.recoverable }, "ublk device detached: serving stopped, device left for recovery");
  }

  async #close(): Promise<void> {
    const started = this.#queues.some((q) => q.commanded);
    if (this.#state !== "failed") this.#state = "stopping";
    let firstError: unknown = null;
    // STOP_DEV aborts the fetched tags; threads that never fetched are told to end below
    if (started) {
      try {
        await this.#ctrl.command(UBLK_CMD.STOP_DEV, this.devId);
      } catch (e) {
        firstError = e;
      }
    }
    await this.#stopQueues(started ? this.#ctrl.timeoutMs : 0);
    await this.#order.idle();
    this.#release();
    try {
      await this.#ctrl.command(UBLK_CMD.DEL_DEV, this.devId);
    } catch (e) {
      firstError ??= e;
    }
    await this.#target?.image.close();
    this.#state = "stopped";
    if (firstError) throw firstError;
  }

  /** Wait for the queue threads to end; past `waitMs`, tell them to stop (then terminate what still runs). */
  async #stopQueues(waitMs: number): Promise<void> {
    await stopQueueThreads(this.#queues, waitMs, this.#ctrl.timeoutMs, this.devId);
  }

  #release(): void {
    for (const q of this.#queues) releaseQueueThread(q);
    this.#queues = [];
    if (this.#charFd >= 0) closeSync(this.#charFd);
    this.#charFd = -1;
  }

  /**
   * Add a device without a target (a warm pool): ADD_DEV with the config's queues, depth and
   * buffer size (and user recovery where offered), /dev/ublkcN opened, descriptors and buffers
   * mapped, every queue thread started and waiting. No block device exists until `bind`.
   * @throws UblkError `ublk.unavailable`, `ublk.control_failed`, `ublk.queue_failed`, `ublk.timeout`;
   *   nothing is left behind
   */
  static async precreate(ctrl: UblkControl, cfg: UblkConfig, opts: DeviceOptions = {}): Promise<UblkDevice> {
    const dev = await UblkDevice.#add(ctrl, cfg, opts);
    log.info({ devId: dev.devId, queues: dev.info.nrHwQueues, depth: dev.info.queueDepth, addMs: dev.timings.addMs, openMs: dev.timings.openMs, threadsMs: dev.timings.threadsMs }, "ublk device pre-created");
    return dev;
  }

  /** ADD_DEV, open, map, start the threads (see `precreate`). */
  static async #add(ctrl: UblkControl, cfg: UblkConfig, opts: DeviceOptions): Promise<UblkDevice> {
    const lap = lapTimer();
    const features = await ctrl.features();
    const wantRecovery = (opts.userRecovery ?? cfg.userRecovery) && (features.flags & UBLK_F.USER_RECOVERY) !== 0n;
    const flags = wantRecovery ? UBLK_F.USER_RECOVERY | UBLK_F.USER_RECOVERY_REISSUE : 0n;
    lap();
    const info = await ctrl.addDevice({
      nrHwQueues: cfg.queues, queueDepth: cfg.queueDepth, state: 0, maxIoBufBytes: cfg.maxIoBytes, devId: opts.devId ?? UBLK_DEV_ID_ANY,
      ublksrvPid: -1, flags, ublksrvFlags: opts.ownerTag ?? 0n, ownerUid: 0, ownerGid: 0,
    });
    const dev = new UblkDevice(ctrl, cfg, info, features.encodedOps, null);
    dev.timings.addMs = lap();
    try {
      await dev.#openChar(cfg.controlTimeoutMs);
      dev.timings.openMs = lap();
      await dev.#spawnQueues(cfg.controlTimeoutMs);
      dev.timings.threadsMs = lap();
      dev.#state = "pooled";
      return dev;
    } catch (e) {
      dev.#state = "failed";
      await dev.close().catch((c) => log.warn({ devId: dev.devId, err: errorMessage(c) }, "cleanup after a failed pre-create"));
      throw e;
    }
  }

  /**
   * Give a pre-created device its target and start it: SET_PARAMS (the target's size, read-only
   * or volatile cache, discard), the queue threads fetch every tag, START_DEV (/dev/ublkbN
   * appears). The device owns the target's image from here on.
   * @throws UblkError `ublk.bad_state` (not a pre-created device), `ublk.bad_config` (size not a
   *   positive multiple of the logical block), `ublk.control_failed`, `ublk.queue_failed`,
   *   `ublk.timeout`; on any failure but the first two the device is removed
   */
  async bind(target: UblkTarget): Promise<void> {
    if (this.#state !== "pooled") throw new UblkError("ublk.bad_state", `device ${this.devId} is ${this.#state}, not pre-created`, { devId: this.devId, state: this.#state });
    const cfg = this.#cfg;
    const img = target.image;
    checkSize(img.size, cfg);
    this.#state = "starting";
    this.#setTarget(target);
    const lap = lapTimer();
    try {
      const maxSectors = this.info.maxIoBufBytes / 512;
      await this.#ctrl.command(UBLK_CMD.SET_PARAMS, this.devId, {
        payload: encodeParams({
          attrs: img.readOnly ? UBLK_ATTR.READ_ONLY : UBLK_ATTR.VOLATILE_CACHE,
          logicalBsShift: cfg.logicalBlockShift,
          physicalBsShift: cfg.physicalBlockShift,
          ioOptShift: cfg.physicalBlockShift,
          ioMinShift: cfg.logicalBlockShift,
          maxSectors,
          devSectors: img.size / 512,
          discard: target.discard && !img.readOnly ? { granularity: 1 << cfg.physicalBlockShift, maxDiscardSectors: maxSectors, maxWriteZeroesSectors: maxSectors } : undefined,
        }),
      });
      this.timings.paramsMs = lap();
      await this.#serveQueues(cfg.controlTimeoutMs);
      this.timings.fetchMs = lap();
      await this.#ctrl.command(UBLK_CMD.START_DEV, this.devId, { data0: process.pid });
      this.timings.startMs = lap();
      this.#state = "live";
      // a pre-created device's add/open/threads were spent before it was bound (its "pre-created" line)
      log.info({ devId: this.devId, path: this.blockPath, target: target.describe, size: img.size, queues: this.info.nrHwQueues, depth: this.info.queueDepth, recovery: this.recoverable, pooled: !this.#fresh, ...this.timings }, "ublk device started");
    } catch (e) {
      this.#state = "failed";
      await this.close().catch((c) => log.warn({ devId: this.devId, err: errorMessage(c) }, "cleanup after a failed start"));
      throw e;
    }
  }

  /**
   * Create and start a device serving `target` (`precreate` + `bind`).
   * @throws UblkError `ublk.unavailable`, `ublk.bad_config` (size not a multiple of the logical
   * block), `ublk.control_failed`, `ublk.queue_failed`, `ublk.timeout`; nothing is left behind
   */
  static async create(ctrl: UblkControl, target: UblkTarget, cfg: UblkConfig, opts: DeviceOptions = {}): Promise<UblkDevice> {
    checkSize(target.image.size, cfg);
    const dev = await UblkDevice.#add(ctrl, cfg, opts);
    dev.#fresh = true;
    await dev.bind(target);
    return dev;
  }

  /**
   * Serve device `devId` again after its server died (user recovery): wait until the kernel has
   * quiesced it and released the old server's files, START_USER_RECOVERY, start the queue
   * threads, END_USER_RECOVERY. Requests the guest issued meanwhile were held and now run.
   * @throws UblkError `ublk.not_found`, `ublk.not_recoverable` (no USER_RECOVERY, another live
   * server, wrong size), `ublk.timeout`, `ublk.control_failed`, `ublk.queue_failed`
   */
  static async recover(ctrl: UblkControl, devId: number, target: UblkTarget, cfg: UblkConfig): Promise<UblkDevice> {
    const features = await ctrl.features();
    let info = await ctrl.deviceInfo(devId);
    if ((info.flags & UBLK_F.USER_RECOVERY) === 0n) throw new UblkError("ublk.not_recoverable", `device ${devId} was created without user recovery`, { devId, flags: info.flags.toString() });
    const params = await ctrl.deviceParams(devId);
    if (params.devSectors * 512 !== target.image.size) {
      throw new UblkError("ublk.not_recoverable", `device ${devId} has ${params.devSectors * 512} bytes, the target ${target.image.size}`, { devId, deviceBytes: params.devSectors * 512, targetBytes: target.image.size });
    }
    const deadline = Date.now() + cfg.recoveryWaitMs;
    // the kernel notices the dead server on its own schedule (6.1: a 5 s monitor), then quiesces
    while (info.state !== UBLK_S_DEV.QUIESCED) {
      if (info.state === UBLK_S_DEV.DEAD) throw new UblkError("ublk.not_recoverable", `device ${devId} is stopped`, { devId, state: info.state });
      if (info.state === UBLK_S_DEV.LIVE && info.ublksrvPid > 0 && processAlive(info.ublksrvPid)) {
        throw new UblkError("ublk.not_recoverable", `device ${devId} is served by the running process ${info.ublksrvPid}`, { devId, pid: info.ublksrvPid });
      }
      if (Date.now() > deadline) throw new UblkError("ublk.timeout", `device ${devId} did not become recoverable within ${cfg.recoveryWaitMs} ms (state ${info.state}, server pid ${info.ublksrvPid})`, { devId, state: info.state, pid: info.ublksrvPid });
      await Bun.sleep(RECOVERY_POLL_MS);
      info = await ctrl.deviceInfo(devId);
    }
    for (;;) {
      const r = await ctrl.raw(UBLK_CMD.START_USER_RECOVERY, devId);
      if (r.res === 0) break;
      // EBUSY: the dead server's /dev/ublkcN is not released yet
      if (r.res !== -EBUSY || Date.now() > deadline) throw new UblkError("ublk.control_failed", `START_USER_RECOVERY of device ${devId} failed: ${errnoName(-r.res)}`, { command: "START_USER_RECOVERY", devId, errno: -r.res });
      await Bun.sleep(RECOVERY_POLL_MS);
    }
    const dev = new UblkDevice(ctrl, cfg, info, features.encodedOps, target);
    try {
      await dev.#openChar(Math.max(0, deadline - Date.now()));
      await dev.#spawnQueues(cfg.controlTimeoutMs);
      await dev.#serveQueues(cfg.controlTimeoutMs);
      await ctrl.command(UBLK_CMD.END_USER_RECOVERY, devId, { data0: process.pid });
      dev.#state = "live";
      log.info({ devId, path: dev.blockPath, target: target.describe, queues: info.nrHwQueues, depth: info.queueDepth }, "ublk device recovered");
      return dev;
    } catch (e) {
      dev.#state = "failed";
      // the device stays quiesced for another attempt: release only what this process took
      await dev.#stopQueues(1000);
      dev.#release();
      throw e;
    }
  }
}

/** @throws UblkError `ublk.bad_config` unless `size` is a positive multiple of the logical block */
function checkSize(size: number, cfg: UblkConfig): void {
  const lbs = 1 << cfg.logicalBlockShift;
  if (size <= 0 || size % lbs !== 0) throw new UblkError("ublk.bad_config", `image size ${size} is not a positive multiple of the ${lbs}-byte logical block`, { size, logicalBlockBytes: lbs });
}

/** A stopwatch: each call returns the ms (one decimal) since the previous call, or since its making. */
function lapTimer(): () => number {
  let t = performance.now();
  return () => {
    const now = performance.now();
    const d = Math.round((now - t) * 10) / 10;
    t = now;
    return d;
  };
}
