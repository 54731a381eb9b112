/**
 * The ublk control channel: commands to /dev/ublk-control as IORING_OP_URING_CMD in a 128-byte-SQE
 * ring owned by the calling (main) thread, never blocking it. The driver runs commands that may
 * sleep (START_DEV waits for every queue, DEL_DEV for the device's release) in an io-wq worker, so
 * completions arrive later: the ring signals a registered eventfd and an asynchronous read of that
 * eventfd (in Bun's I/O thread pool) wakes the event loop, which reaps the CQEs. Payloads
 * (dev_info, params) live in an mmap'd slab whose slot stays reserved until the kernel completes
 * the command, even when the caller gave up waiting. Facts: ../shared/docs/ublk-iouring-firecracker.md
 * §1.1–1.2, §1.8; ../shared/docs/guest-kernel.md §5 (the 6.1 driver takes legacy opcodes only).
 */
import { closeSync, existsSync, openSync, read } from "node:fs";
import { closeEventfd, createEventfd, signalEventfd } from "../../ffi/eventfd.ts";
import { IORING_SETUP, IoUring, IoUringError, SQE } from "../../ffi/io_uring.ts";
import { mapMemory, unmapMemory, type Mapping } from "../../ffi/mmap.ts";
import {
  CTRL_CMD, ctrlOpcode, decodeDevInfo, DEV_INFO, type DevInfo, encodeCtrlCmd, encodeDevInfo, PARAMS, UBLK_CMD, UBLK_CONTROL_PATH, UBLK_F_LEGACY,
} from "../../ffi/ublk.ts";
import { UblkError } from "./errors.ts";
import { errorMessage } from "../../util/error.ts";

const O_RDWR = 2, O_CLOEXEC = 0o2000000;
/** Commands in flight at once (ring entries and payload slots). */
const SLOTS = 32;
/** Payload bytes per slot (the largest payload, ublk_params, is 60 bytes). */
const SLOT_BYTES = 128;

/** Errno names for messages. */
const ERRNO: Record<number, string> = { 1: "EPERM", 2: "ENOENT", 4: "EINTR", 11: "EAGAIN", 12: "ENOMEM", 13: "EACCES", 14: "EFAULT", 16: "EBUSY", 17: "EEXIST", 19: "ENODEV", 22: "EINVAL", 95: "EOPNOTSUPP" };
/** Name an errno (`EBUSY`), or its number. */
export function errnoName(e: number): string {
  return ERRNO[e] ?? `errno ${e}`;
}

const CMD_NAME: Record<number, string> = Object.fromEntries(Object.entries(UBLK_CMD).map(([k, v]) => [v, k]));

/** What the kernel supports, from GET_FEATURES (6.5+) or assumed for older kernels. */
export interface UblkFeatures {
  /** UBLK_F_* the kernel accepts. */
  flags: bigint;
  /** Opcode form to send: ioctl-encoded (kernel answered GET_FEATURES) or legacy numbers. */
  encodedOps: boolean;
}

interface Pending {
  resolve: (r: { res: number; out: Uint8Array }) => void;
  reject: (e: Error) => void;
  timer: ReturnType<typeof setTimeout>;
  /** Copy out this many payload bytes on completion. */
  outLen: number;
  /** The caller stopped waiting (timeout); the slot is freed on the CQE. */
  abandoned: boolean;
}

/** Options of one control command. */
export interface CommandOptions {
  /** Inline argument (`data[0]`): server pid for START_DEV / END_USER_RECOVERY. */
  data0?: number;
  /** Payload written to the command buffer before submission (`addr`/`len` point at it). */
  payload?: Uint8Array;
  /** Buffer length the kernel may use, bytes (default: the payload's length). */
  len?: number;
}

/**
 * One open control channel. Use `UblkControl.open()`; `close()` when done (after the last
 * command completed).
 */
export class UblkControl {
  #fd: number;
  #ring: IoUring;
  #efd: number;
  #slab: Mapping;
  #free: number[] = Array.from({ length: SLOTS }, (_, i) => SLOTS - 1 - i);
  #pending = new Map<number, Pending>();
  #armed = false;
  #closed = false;
  #features: UblkFeatures | null = null;
  readonly timeoutMs: number;

  private constructor(fd: number, timeoutMs: number) {
    this.#fd = fd;
    this.timeoutMs = timeoutMs;
    this.#ring = new IoUring({ entries: SLOTS, cqEntries: SLOTS * 2, flags: IORING_SETUP.SQE128 });
    this.#efd = createEventfd();
    this.#ring.registerEventfd(this.#efd);
    this.#slab = mapMemory(SLOTS * SLOT_BYTES);
  }

  /**
   * Open /dev/ublk-control (close-on-exec, so children such as a VMM do not inherit it).
   * @param timeoutMs longest wait for any one command
   * @throws UblkError `ublk.unavailable` (no device node, no permission, io_uring refused)
   */
  static open(timeoutMs: number): UblkControl {
    if (!existsSync(UBLK_CONTROL_PATH)) throw new UblkError("ublk.unavailable", `${UBLK_CONTROL_PATH} does not exist (kernel without CONFIG_BLK_DEV_UBLK or ublk_drv not loaded)`, { path: UBLK_CONTROL_PATH });
    let fd: number;
    try {
      fd = openSync(UBLK_CONTROL_PATH, O_RDWR | O_CLOEXEC);
    } catch (e) {
      throw new UblkError("ublk.unavailable", `cannot open ${UBLK_CONTROL_PATH}: ${errorMessage(e)}`, { path: UBLK_CONTROL_PATH });
    }
    try {
      return new UblkControl(fd, timeoutMs);
    } catch (e) {
      closeSync(fd);
      const errno = e instanceof IoUringError ? e.errno : undefined;
      throw new UblkError("ublk.unavailable", `cannot set up the control ring: ${errorMessage(e)}`, { errno });
    }
  }

  /**
   * Send control command `nr` for device `devId` and wait for its completion.
   * @returns the CQE result (0 or a positive value) and the payload as the kernel left it
   * @throws UblkError `ublk.control_failed` (negative result; details.errno), `ublk.timeout`
   */
  async command(nr: number, devId: number, opts: CommandOptions = {}): Promise<{ res: number; out: Uint8Array }> {
    const r = await this.raw(nr, devId, opts);
    if (r.res < 0) {
      const e = -r.res;
      throw new UblkError("ublk.control_failed", `${CMD_NAME[nr] ?? nr} of device ${devId} failed: ${errnoName(e)}`, { command: CMD_NAME[nr] ?? nr, devId, errno: e });
    }
    return r;
  }

  /**
   * Like `command`, but a negative result is returned instead of thrown (for commands whose
   * failure is an answer, e.g. GET_FEATURES on an old kernel, START_USER_RECOVERY while busy).
   * @throws UblkError `ublk.timeout`, `ublk.unavailable` (closed channel)
   */
  raw(nr: number, devId: number, opts: CommandOptions = {}): Promise<{ res: number; out: Uint8Array }> {
    if (this.#closed) return Promise.reject(new UblkError("ublk.unavailable", "the ublk control channel is closed"));
    const slot = this.#free.pop();
    if (slot === undefined) return Promise.reject(new UblkError("ublk.control_failed", `more than ${SLOTS} control commands in flight`, { command: CMD_NAME[nr] ?? nr, devId }));
    const base = slot * SLOT_BYTES;
    const mem = new Uint8Array(this.#slab.buffer, base, SLOT_BYTES);
    mem.fill(0);
    if (opts.payload) mem.set(opts.payload);
    const len = opts.len ?? opts.payload?.length ?? 0;
    const encoded = this.#features?.encodedOps ?? false;
    const op = nr === UBLK_CMD.GET_FEATURES ? ctrlOpcode(nr, true) : ctrlOpcode(nr, encoded);
    const w = this.#ring.prepUringCmd(this.#fd, op, slot);
    const dv = new DataView(this.#ring.sqeWords.buffer, this.#ring.sqeWords.byteOffset + w * 4 + SQE.CMD, CTRL_CMD.SIZE);
    encodeCtrlCmd(dv, 0, { devId, len, addr: len ? this.#slab.ptr + base : 0, data0: opts.data0 ?? 0 });
    return new Promise((resolve, reject) => {
      const p: Pending = {
        resolve,
        reject,
        outLen: len,
        abandoned: false,
        timer: setTimeout(() => {
          p.abandoned = true;
          reject(new UblkError("ublk.timeout", `${CMD_NAME[nr] ?? nr} of device ${devId} did not complete within ${this.timeoutMs} ms`, { command: CMD_NAME[nr] ?? nr, devId, timeoutMs: this.timeoutMs }));
        }, this.timeoutMs),
      };
      this.#pending.set(slot, p);
      try {
        this.#ring.submit(0);
      } catch (e) {
        this.#pending.delete(slot);
        this.#free.push(slot);
        clearTimeout(p.timer);
        reject(new UblkError("ublk.control_failed", `cannot submit ${CMD_NAME[nr] ?? nr}: ${errorMessage(e)}`, { command: CMD_NAME[nr] ?? nr, devId }));
        return;
      }
      this.#reap();
      this.#arm();
    });
  }

  #reap(): void {
    this.#ring.reap((slot, res) => {
      const p = this.#pending.get(slot);
      if (!p) return;
      this.#pending.delete(slot);
      clearTimeout(p.timer);
      const out = new Uint8Array(this.#slab.buffer, slot * SLOT_BYTES, SLOT_BYTES).slice(0, p.outLen);
      this.#free.push(slot);
      if (!p.abandoned) p.resolve({ res, out });
    });
  }

  /** Wait (off-thread) for the eventfd while commands are pending. */
  #arm(): void {
    if (this.#armed || this.#pending.size === 0) return;
    this.#armed = true;
    const buf = Buffer.alloc(8);
    read(this.#efd, buf, 0, 8, null, (err) => {
      this.#armed = false;
      if (this.#closed) return this.#release();
      if (err) {
        for (const [slot, p] of this.#pending) {
          clearTimeout(p.timer);
          p.reject(new UblkError("ublk.control_failed", `waiting for control completions failed: ${err.message}`, { slot }));
        }
        this.#pending.clear();
        return;
      }
      this.#reap();
      this.#arm();
    });
  }

  /**
   * The kernel's features: GET_FEATURES (Linux 6.5+, ioctl-encoded opcodes); a kernel that does
   * not know it (6.0–6.4: -EOPNOTSUPP, or -ENODEV from 6.1's device lookup) gets legacy opcodes
   * and the 6.1 flag set. Cached.
   * @throws UblkError `ublk.timeout`, `ublk.unavailable`
   */
  async features(): Promise<UblkFeatures> {
    if (this.#features) return this.#features;
    const r = await this.raw(UBLK_CMD.GET_FEATURES, 0xffffffff, { len: 8 });
    this.#features = r.res === 0 ? { flags: new DataView(r.out.buffer, r.out.byteOffset, 8).getBigUint64(0, true), encodedOps: true } : { flags: UBLK_F_LEGACY, encodedOps: false };
    return this.#features;
  }

  /**
   * ADD_DEV: create a device (`/dev/ublkcN` appears). `info.devId` 0xFFFFFFFF lets the kernel pick.
   * @returns the kernel's view: chosen id, accepted flags, clamped queues, rounded buffer size
   * @throws UblkError `ublk.control_failed` (EEXIST: id taken, EINVAL: bad info)
   */
  async addDevice(info: DevInfo): Promise<DevInfo> {
    const b = new Uint8Array(DEV_INFO.SIZE);
    encodeDevInfo(new DataView(b.buffer), 0, info);
    const r = await this.command(UBLK_CMD.ADD_DEV, info.devId, { payload: b });
    return decodeDevInfo(new DataView(r.out.buffer, r.out.byteOffset, DEV_INFO.SIZE), 0);
  }

  /**
   * GET_DEV_INFO of device `devId`.
   * @throws UblkError `ublk.not_found` (ENODEV), `ublk.control_failed`
   */
  async deviceInfo(devId: number): Promise<DevInfo> {
    const r = await this.raw(UBLK_CMD.GET_DEV_INFO, devId, { len: DEV_INFO.SIZE });
    if (r.res === -19) throw new UblkError("ublk.not_found", `no ublk device ${devId}`, { devId });
    if (r.res < 0) throw new UblkError("ublk.control_failed", `GET_DEV_INFO of device ${devId} failed: ${errnoName(-r.res)}`, { command: "GET_DEV_INFO", devId, errno: -r.res });
    return decodeDevInfo(new DataView(r.out.buffer, r.out.byteOffset, DEV_INFO.SIZE), 0);
  }

  /**
   * GET_PARAMS: the device's capacity in 512-byte sectors and its attribute bits.
   * @throws UblkError `ublk.control_failed`
   */
  async deviceParams(devId: number): Promise<{ devSectors: number; attrs: number; logicalBsShift: number }> {
    const b = new Uint8Array(PARAMS.SIZE);
    new DataView(b.buffer).setUint32(PARAMS.LEN, PARAMS.SIZE, true);
    const r = await this.command(UBLK_CMD.GET_PARAMS, devId, { payload: b });
    const dv = new DataView(r.out.buffer, r.out.byteOffset, PARAMS.SIZE);
    return { devSectors: Number(dv.getBigUint64(PARAMS.BASIC + 16, true)), attrs: dv.getUint32(PARAMS.BASIC, true), logicalBsShift: dv.getUint8(PARAMS.BASIC + 4) };
  }

  /** Release the ring, eventfd and slab once nothing is pending; idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const p of this.#pending.values()) {
      clearTimeout(p.timer);
      if (!p.abandoned) p.reject(new UblkError("ublk.unavailable", "the ublk control channel was closed"));
    }
    if (this.#armed) signalEventfd(this.#efd); // the pending read returns, then releases
    else this.#release();
  }

  #release(): void {
    // a command the kernel still runs keeps its slot: leave the slab mapped in that case
    if (this.#pending.size === 0) unmapMemory(this.#slab);
    this.#ring.close();
    closeEventfd(this.#efd);
    closeSync(this.#fd);
  }
}
