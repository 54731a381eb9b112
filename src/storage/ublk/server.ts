/**
 * `UblkServer`: one process's ublk control channel plus the devices it serves. Device ids, the
 * kernel's device list, removal of devices left by a dead server, and the sweep of an owner's
 * devices nobody recorded live here; one device's lifecycle is in device.ts.
 */
import { existsSync, readdirSync } from "node:fs";
import { UBLK_CMD, UBLK_CONTROL_PATH, UBLK_F, UBLK_S_DEV, type DevInfo } from "../../ffi/ublk.ts";
import { logger } from "../../observability/log.ts";
import type { UblkConfig } from "./config.ts";
import { UblkControl, type UblkFeatures } from "./control.ts";
import { processAlive } from "../../ffi/proc.ts";
import { UblkDevice, type DeviceOptions } from "./device.ts";
import { UblkError } from "./errors.ts";
import type { UblkTarget } from "./targets.ts";
import { errorMessage } from "../../util/error.ts";

const log = logger("ublk");
/** sysfs class of ublk char devices (`ublk_chr_class`, drivers/block/ublk_drv.c). */
const UBLK_CHAR_CLASS = "/sys/class/ublk-char";

/** True when this kernel offers ublk (the control device exists). */
export function ublkAvailable(): boolean {
  return existsSync(UBLK_CONTROL_PATH);
}

/** One device as the kernel reports it. */
export interface UblkDeviceSummary {
  devId: number;
  /** "dead" (stopped or never started), "live", "quiesced" (server gone, recoverable), "fail_io". */
  state: "dead" | "live" | "quiesced" | "fail_io";
  /** pid of the server that started or recovered it, -1 when none. */
  serverPid: number;
  queues: number;
  depth: number;
  recoverable: boolean;
  /** The owner tag the device was added with (its `ublksrv_flags`, hex), null when 0. */
  owner: string | null;
}

const STATE_NAMES = ["dead", "live", "quiesced", "fail_io"] as const;

function summary(i: DevInfo): UblkDeviceSummary {
  return {
    devId: i.devId,
    state: STATE_NAMES[i.state] ?? "dead",
    serverPid: i.ublksrvPid,
    queues: i.nrHwQueues,
    depth: i.queueDepth,
    recoverable: (i.flags & UBLK_F.USER_RECOVERY) !== 0n,
    owner: i.ublksrvFlags === 0n ? null : `0x${i.ublksrvFlags.toString(16)}`,
  };
}

/**
 * The owner tag of a disk daemon on directory `dir`: "AENV" in the high 32 bits, the 32-bit
 * FNV-1a hash of the path in the low ones. Devices carry it in `ublksrv_flags`, so a daemon can
 * find devices it added but never recorded (a crash right after ADD_DEV) without touching those
 * of other servers on the host.
 */
export function ownerTagOf(dir: string): bigint {
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(dir)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return (0x41454e56n << 32n) | BigInt(h);
}

/** The ublk server of this process. */
export class UblkServer {
  readonly config: UblkConfig;
  /** Tag every device this server adds carries (0: none). */
  readonly ownerTag: bigint;
  #ctrl: UblkControl;
  #devices = new Set<UblkDevice>();

  private constructor(cfg: UblkConfig, ctrl: UblkControl, ownerTag: bigint) {
    this.config = cfg;
    this.#ctrl = ctrl;
    this.ownerTag = ownerTag;
  }

  /**
   * Open the control channel.
   * @param opts.ownerTag stored in every device this server adds (see `ownerTagOf`); default 0
   * @throws UblkError `ublk.unavailable`
   */
  static open(cfg: UblkConfig, opts: { ownerTag?: bigint } = {}): UblkServer {
    return new UblkServer(cfg, UblkControl.open(cfg.controlTimeoutMs), opts.ownerTag ?? 0n);
  }

  /** The kernel's ublk features (flags, opcode form). */
  features(): Promise<UblkFeatures> {
    return this.#ctrl.features();
  }

  /** Devices this server created or recovered and has not closed. */
  get devices(): readonly UblkDevice[] {
    for (const d of this.#devices) if (d.state === "stopped" || d.state === "detached") this.#devices.delete(d);
    return [...this.#devices];
  }

  #track(dev: UblkDevice): UblkDevice {
    this.#devices.add(dev);
    return dev;
  }

  /**
   * Create and start a device for `target` (queues, depth, buffer size, block size from the
   * config). The device owns the target's image from here on.
   * @throws UblkError (see `UblkDevice.create`); the target is closed on failure
   */
  async create(target: UblkTarget, opts: DeviceOptions = {}): Promise<UblkDevice> {
    try {
      return this.#track(await UblkDevice.create(this.#ctrl, target, this.config, { ownerTag: this.ownerTag, ...opts }));
    } catch (e) {
      await target.image.close().catch(() => {});
      throw e;
    }
  }

  /**
   * Add a device without a target, to `bind` one later (a warm pool; see `UblkDevice.precreate`).
   * @throws UblkError (see `UblkDevice.precreate`)
   */
  async precreate(opts: DeviceOptions = {}): Promise<UblkDevice> {
    return this.#track(await UblkDevice.precreate(this.#ctrl, this.config, { ownerTag: this.ownerTag, ...opts }));
  }

  /**
   * Take over device `devId` after its server died (user recovery).
   * @throws UblkError (see `UblkDevice.recover`); the target is closed on failure
   */
  async recover(devId: number, target: UblkTarget): Promise<UblkDevice> {
    try {
      return this.#track(await UblkDevice.recover(this.#ctrl, devId, target, this.config));
    } catch (e) {
      await target.image.close().catch(() => {});
      throw e;
    }
  }

  /**
   * The kernel's view of device `devId`.
   * @throws UblkError `ublk.not_found`
   */
  async info(devId: number): Promise<UblkDeviceSummary> {
    return summary(await this.#ctrl.deviceInfo(devId));
  }

  /** Every ublk device of this kernel (from sysfs), whoever serves it. */
  async list(): Promise<UblkDeviceSummary[]> {
    if (!existsSync(UBLK_CHAR_CLASS)) return [];
    const ids = readdirSync(UBLK_CHAR_CLASS).map((n) => /^ublkc(\d+)$/.exec(n)?.[1]).filter((x): x is string => x !== undefined).map(Number).sort((a, b) => a - b);
    const out: UblkDeviceSummary[] = [];
    for (const id of ids) {
      try {
        out.push(await this.info(id));
      } catch (e) {
        if ((e as UblkError).code !== "ublk.not_found") throw e; // deleted meanwhile
      }
    }
    return out;
  }

  /**
   * Remove a device this process does not serve (left by a server that died): STOP_DEV unless
   * already stopped, then DEL_DEV.
   * @throws UblkError `ublk.not_found`, `ublk.busy` (a running process serves it, or it is one of
   * ours: close that instead), `ublk.control_failed`
   */
  async remove(devId: number): Promise<void> {
    if (this.devices.some((d) => d.devId === devId)) throw new UblkError("ublk.busy", `device ${devId} is served by this process: close it`, { devId });
    const info = await this.#ctrl.deviceInfo(devId);
    if (info.ublksrvPid > 0 && info.state === UBLK_S_DEV.LIVE && processAlive(info.ublksrvPid)) {
      throw new UblkError("ublk.busy", `device ${devId} is served by the running process ${info.ublksrvPid}`, { devId, pid: info.ublksrvPid });
    }
    if (info.state !== UBLK_S_DEV.DEAD) await this.#ctrl.command(UBLK_CMD.STOP_DEV, devId);
    await this.#ctrl.command(UBLK_CMD.DEL_DEV, devId);
    log.info({ devId, state: info.state, pid: info.ublksrvPid }, "removed ublk device left by a dead server");
  }

  /**
   * STOP_DEV of a device another process serves: its block device goes away and its server sees
   * every tag aborted (and then removes it). For tools and tests of a server losing its device.
   * @throws UblkError `ublk.not_found`, `ublk.busy` (one of ours: close it), `ublk.control_failed`
   */
  async stop(devId: number): Promise<void> {
    if (this.devices.some((d) => d.devId === devId)) throw new UblkError("ublk.busy", `device ${devId} is served by this process: close it`, { devId });
    await this.#ctrl.deviceInfo(devId);
    await this.#ctrl.command(UBLK_CMD.STOP_DEV, devId);
    log.info({ devId }, "stopped a ublk device served by another process");
  }

  /**
   * Remove every device that carries this server's owner tag, is not in `keep`, and is not
   * served by this process or another running one: what a crashed owner added but never
   * recorded. Needs an owner tag.
   * @returns the ids removed
   * @throws UblkError `ublk.bad_config` without an owner tag
   */
  async sweep(keep: ReadonlySet<number>): Promise<number[]> {
    if (this.ownerTag === 0n) throw new UblkError("ublk.bad_config", "a sweep needs an owner tag", { field: "ownerTag" });
    const removed: number[] = [];
    for (const d of await this.list()) {
      if (d.owner !== `0x${this.ownerTag.toString(16)}` || keep.has(d.devId) || this.devices.some((x) => x.devId === d.devId)) continue;
      try {
        await this.remove(d.devId);
        removed.push(d.devId);
      } catch (e) {
        log.warn({ devId: d.devId, err: errorMessage(e) }, "an unrecorded device of this owner was not removed");
      }
    }
    if (removed.length) log.warn({ removed }, "removed ublk devices of this owner that no record names");
    return removed;
  }

  /** Close every device of this server, then the control channel. */
  async close(): Promise<void> {
    const errors: unknown[] = [];
    for (const d of this.devices) await d.close().catch((e) => errors.push(e));
    this.#ctrl.close();
    if (errors.length) throw errors[0];
  }
}
