/**
 * The node's handle on its disk daemon: starts `agentenv ublk-daemon` (after shutting down one a
 * crashed node left, which removes its devices), talks to it (./client.ts), keeps a copy of every
 * FUSE connection it hands out (so the mounts outlive a daemon crash), starts it again when it
 * dies (the new one serves the same devices: ./manager.ts `recover`), and shuts it down last.
 *
 * Adoption (issue 27, `mode: "adopt"`): a daemon a previous node left on the directory and that
 * speaks this node's protocol version (`DISK_PROTOCOL_VERSION`) is kept, with its devices: the
 * node re-claims the exports its sandboxes use by device id (`claim`: the same kind of handle
 * `rootDisk`/`exportDisk`/`acquireShared` gave, its FUSE connection copied again and this node
 * registered as its holder), then removes what nobody claimed (`reapUnclaimed`). A daemon that
 * does not answer or speaks another version is shut down as in the default mode. When no daemon
 * is left (it died while no node watched), a new one serves again what it can recover; what it
 * cannot is reported lost by `claim`.
 *
 * The daemon runs in its own session (`detached`: setsid before exec), so a Ctrl-C on the node's
 * terminal reaches only the node, which then closes the disks in order.
 *
 * A device that is gone without this node asking (the daemon's `device_lost` event; or, after a
 * daemon restart, a device the new daemon does not serve) resolves its handle's `lost`, so the
 * sandbox using it can be failed. The node's copy of a lost FUSE connection is closed (and its
 * mount detached) at once: with no server left, that copy would keep the connection alive and
 * every I/O of the VMM on it waiting for good (unkillable), instead of failing.
 */
import { closeSync, existsSync, mkdirSync, openSync } from "node:fs";
import { dirname, join } from "node:path";
import { MNT_DETACH, umount2 } from "../../ffi/mount.ts";
import { takeFd } from "../../ffi/pidfd.ts";
import { holdProcess } from "../../ffi/pidfd-watch.ts";
import { processStartTime } from "../../ffi/proc.ts";
import { logger } from "../../observability/log.ts";
import { errorMessage } from "../../util/error.ts";
import { DaemonClient, type Answer, type Req } from "./client.ts";
import { daemonSettings, type DiskConfig } from "./config.ts";
import { daemonPaths } from "./daemon.ts";
import { DiskError } from "../errors.ts";
import { adoptedDaemon, agentenvCommand, isDaemon, readLine, spawnedDaemon, stopLeftoverDaemon, tail, type DaemonProcess } from "./process.ts";
import { DISK_PROTOCOL_VERSION, type DeviceInfo, type DeviceStats, type EngineName, type Request, type TargetSpec } from "./protocol.ts";

const log = logger("disk");

export { agentenvCommand };

/** One device handed to this node. */
export interface DiskExport {
  /** Device id. */
  readonly id: string;
  /** What the VMM opens (a file on a FUSE mount, or /dev/ublkbN). */
  readonly path: string;
  readonly engine: EngineName;
  readonly access: "exclusive" | "shared";
  /** For an exclusive acquire: true when a pre-created export of the warm pool was used. */
  readonly fromPool: boolean;
  /** Counters of the device (reads, bytes, opens, image opens, refcount). */
  stats(): Promise<DeviceStats>;
  /**
   * Resolves with the reason when the device is gone without `close()` (its kernel object was
   * removed, or a restarted daemon could not serve it again); never resolves otherwise.
   */
  readonly lost: Promise<string>;
  /**
   * Stop using the device: an exclusive one is removed (a sandbox's upper files stay), a shared
   * one loses this reference and goes with its last. Stop the VMM first. Idempotent.
   */
  close(): Promise<void>;
}

/** Inputs of `DiskService.rootDisk`. */
export interface RootDiskOptions {
  /** Sandbox id (the device id). */
  id: string;
  /** Template layer files, bottom first (absolute paths; never written). */
  lowers: string[];
  /** The sandbox's own directory: upper files go to `upper/`, the mount to `mnt/`. */
  sandboxDir: string;
  /** Virtual disk size in bytes (multiple of 512); 0 = the template's size. */
  virtualSize?: number;
}

/** Name of the served root disk file inside `<sandboxDir>/mnt/`. */
export const ROOT_DISK_FILE = "root.img";

/** Device id of the shared device of `key` (what `acquireShared` made; `claim` takes it). */
export function sharedDeviceId(key: string): string {
  return `shared.${key}`;
}

/** How `start` treats a daemon a previous node left on the directory. */
export type DiskStartMode = "fresh" | "adopt";

/** What `claim` found for a device id. */
export type DiskClaim =
  | { kind: "claimed"; disk: DiskExport }
  /** The daemon lost it (its connection ended, or a restarted daemon could not serve it again). */
  | { kind: "lost"; reason: string }
  /** No such device (never made, already removed, or reaped as unclaimed). */
  | { kind: "missing" };

/** Paths of a sandbox's writable upper layer. */
export function upperPaths(sandboxDir: string): { data: string; index: string } {
  return { data: join(sandboxDir, "upper", "upper.data"), index: join(sandboxDir, "upper", "upper.index") };
}

/** The node side of the disk daemon. */
export class DiskService {
  readonly dir: string;
  readonly config: DiskConfig;
  #started: Promise<void> | undefined;
  readonly mode: DiskStartMode;
  #adopted = false;
  /** Devices the adopted daemon had at start, not yet claimed whole, and those it had lost. */
  #claimable = new Map<string, DeviceInfo>();
  #lostAtStart = new Map<string, string>();
  /** `#restarts` when `#claimable` was read: a restarted daemon's fds and devices differ. */
  #claimableAt = 0;
  #proc!: DaemonProcess;
  #client!: DaemonClient;
  #ready: Promise<void> = Promise.resolve();
  /** Daemons that died and were started again (and became ready). */
  #restarts = 0;
  /** Restarts tried, bounded by `maxRestarts`. */
  #attempts = 0;
  #stopping = false;
  #closed: Promise<void> | undefined;
  #dead: DiskError | null = null;
  /** FUSE connection copies this node holds, by device id. */
  #held = new Map<string, number>();
  /** Open handles per device id (a shared device may be acquired several times). */
  #refs = new Map<string, number>();
  /** Who waits for each device id's loss (the `lost` of every open handle). */
  #lostWaiters = new Map<string, Set<(reason: string) => void>>();
  /** Mount point of each FUSE device handed to this node. */
  #mounts = new Map<string, string>();

  /**
   * A service for the daemon on `dir` (`<runtime_path>/disk`); the daemon starts with `start()`
   * or on the first request. `mode` (default "fresh"): what `start` does with a daemon a previous
   * node left (see `start`).
   */
  constructor(opts: { dir: string; config: DiskConfig; mode?: DiskStartMode }) {
    this.dir = opts.dir;
    this.config = opts.config;
    this.mode = opts.mode ?? "fresh";
  }

  /**
   * Start the daemon (once). "fresh": a daemon a crashed node left on the directory is shut down
   * first (it removes every device it had), or killed when it does not answer. "adopt": such a
   * daemon that answers with this node's protocol version is kept with its devices (`adopted`;
   * then `claim` and `reapUnclaimed`); otherwise as "fresh".
   * @throws DiskError `disk.daemon_failed` (did not start; details.log holds its log tail)
   */
  start(): Promise<void> {
    return (this.#started ??= (async () => {
      mkdirSync(this.dir, { recursive: true });
      if (this.mode === "adopt" && (await this.#adoptLeftover())) return;
      await stopLeftoverDaemon(this.dir, this.config);
      await this.#spawn();
      if (this.mode === "adopt") await this.#noteClaimable();
    })());
  }

  /** Start the daemon on `opts.dir` now (see `start`). */
  static async start(opts: { dir: string; config: DiskConfig; mode?: DiskStartMode }): Promise<DiskService> {
    const s = new DiskService(opts);
    await s.start();
    return s;
  }

  /** True when `start` kept a daemon a previous node left (adopt mode). */
  get adopted(): boolean {
    return this.#adopted;
  }

  /**
   * Take over device `id` a previous node had (adopt mode, after `start`): an exclusive device
   * (a root disk, a volume drive) once, a shared one (`sharedDeviceId(key)`: a memory image) once
   * per reference the previous node held. The handle is the kind `rootDisk`/`exportDisk`/
   * `acquireShared` return (its `close()` releases it); a FUSE device's connection is copied to
   * this node again and this node registered as its holder, so a daemon crash from now on is
   * survived as before.
   * @returns `claimed`, `lost` (with the daemon's reason) or `missing`
   * @throws DiskError `disk.bad_request` outside adopt mode; daemon errors
   */
  async claim(id: string): Promise<DiskClaim> {
    if (this.mode !== "adopt") throw new DiskError("disk.bad_request", "claim needs a disk service started in adopt mode", { field: "mode", value: this.mode });
    await this.start();
    await this.#ready;
    if (this.#claimableAt !== this.#restarts) await this.#noteClaimable();
    const info = this.#claimable.get(id);
    if (!info) {
      const reason = this.#lostAtStart.get(id);
      return reason === undefined ? { kind: "missing" } : { kind: "lost", reason };
    }
    const claims = (this.#refs.get(id) ?? 0) + 1;
    if (claims >= info.refcount) this.#claimable.delete(id);
    return { kind: "claimed", disk: await this.#adopt(info, false, "release") };
  }

  /**
   * Remove every device the previous node left that was not claimed (adopt mode; call once the
   * node claimed what its sandboxes use, before it makes new exports): an exclusive device is
   * deleted, a shared one loses the references nobody claimed (and goes with its last). Later
   * claims of those find them `missing`.
   * @returns the ids of the devices removed, or whose unclaimed references were dropped
   */
  async reapUnclaimed(): Promise<string[]> {
    await this.start();
    const out: string[] = [];
    for (const [id, info] of this.#claimable) {
      this.#claimable.delete(id);
      try {
        if (info.access === "exclusive") await this.#call<"delete">({ kind: "delete", dev_id: id });
        else for (let i = this.#refs.get(id) ?? 0; i < info.refcount; i++) await this.#call<"release">({ kind: "release", dev_id: id });
        out.push(id);
      } catch (e) {
        if (!(e instanceof DiskError && e.code === "disk.not_found")) throw e;
      }
    }
    this.#lostAtStart.clear();
    if (out.length) log.info({ devices: out }, "removed disk devices no sandbox claimed");
    return out;
  }

  /** pid of the running daemon (0 before it started). */
  get pid(): number {
    return this.#proc?.pid ?? 0;
  }

  /** How many times the daemon died and was started again (the new one ready). */
  get restarts(): number {
    return this.#restarts;
  }

  /** The daemon's features (engines, pid, recovered devices). */
  async features(): Promise<Answer<"get_features">> {
    return this.#call<"get_features">({ kind: "get_features" });
  }

  /**
   * Export `target` as a new device (FUSE: mounted on `mountPoint`, default one under the daemon's
   * directory, as `fileName`, default "disk.img").
   * @throws DiskError from the daemon (`disk.exists`, `disk.open_failed`, `disk.bad_request`, ...)
   */
  async exportDisk(opts: { id: string; target: TargetSpec; mountPoint?: string; fileName?: string; directIo?: boolean; engine?: EngineName }): Promise<DiskExport> {
    const info = await this.#call<"create_runtime_device">({
      kind: "create_runtime_device", dev_id: opts.id, target: opts.target, ...(opts.engine ? { engine: opts.engine } : {}),
      fuse: { ...(opts.mountPoint ? { mount_point: opts.mountPoint } : {}), ...(opts.fileName ? { file_name: opts.fileName } : {}), ...(opts.directIo === undefined ? {} : { direct_io: opts.directIo }) },
    });
    return this.#adopt(info, false, "delete");
  }

  /**
   * A sandbox's root disk: the template's layers (shared, read-only) plus the sandbox's own upper
   * in `<sandboxDir>/upper/` (created when missing; a resumed sandbox keeps its writes), served as
   * `<sandboxDir>/mnt/root.img`, from the warm pool when a pre-created export is ready.
   * @throws DiskError `disk.bad_spec` (no lowers, relative paths, bad size), `disk.open_failed`
   *   (a layer is missing); daemon errors
   */
  async rootDisk(opts: RootDiskOptions): Promise<DiskExport> {
    const size = opts.virtualSize ?? 0;
    if (opts.lowers.length === 0 || opts.lowers.some((l) => !l.startsWith("/"))) {
      throw new DiskError("disk.bad_spec", `sandbox ${opts.id}: lowers must be a non-empty list of absolute paths`, { id: opts.id, lowers: opts.lowers });
    }
    if (!opts.sandboxDir.startsWith("/")) throw new DiskError("disk.bad_spec", `sandbox ${opts.id}: sandboxDir must be absolute`, { id: opts.id, sandboxDir: opts.sandboxDir });
    if (!Number.isSafeInteger(size) || size < 0 || size % 512 !== 0) {
      throw new DiskError("disk.bad_spec", `sandbox ${opts.id}: virtual size ${size} is not a multiple of 512`, { id: opts.id, virtualSize: size });
    }
    for (const l of opts.lowers) {
      if (!existsSync(l)) throw new DiskError("disk.open_failed", `sandbox ${opts.id}: template layer ${l} does not exist`, { id: opts.id, path: l });
    }
    const info = await this.#call<"acquire">({
      kind: "acquire", access_mode: "exclusive", dev_id: opts.id,
      target: { kind: "overlaybd", lowers: opts.lowers, upper: upperPaths(opts.sandboxDir), create_upper_size: size },
      fuse: { mount_point: join(opts.sandboxDir, "mnt"), file_name: ROOT_DISK_FILE },
    });
    return this.#adopt(info, info.from_pool, "release");
  }

  /**
   * The shared read-only device of `key` (e.g. a snapshot's memory image): opened once by the
   * daemon, mapped by many VMs (FUSE: FOPEN_KEEP_CACHE, one page cache), released by `close()`
   * of each handle; it goes with the last.
   * @param opts.acceptWritableOpen accept O_RDWR opens (QEMU maps guest RAM that way); writes still fail
   */
  async acquireShared(opts: { key: string; lowers: string[]; fileName?: string; acceptWritableOpen?: boolean } | { key: string; rawPath: string; fileName?: string; acceptWritableOpen?: boolean }): Promise<DiskExport> {
    const target: TargetSpec = "rawPath" in opts
      ? { kind: "raw", path: opts.rawPath, read_only: true, accept_writable_open: opts.acceptWritableOpen ?? false }
      : { kind: "overlaybd", lowers: opts.lowers, accept_writable_open: opts.acceptWritableOpen ?? false };
    const info = await this.#call<"acquire">({ kind: "acquire", access_mode: "shared", share_key: opts.key, target, fuse: opts.fileName ? { file_name: opts.fileName } : {} });
    return this.#adopt(info, false, "release");
  }

  /**
   * Seal device `id`'s upper into a read-only layer and continue on a fresh upper (see
   * `LayeredImage.restack`).
   * @returns the new layer's path
   */
  async restack(id: string, outputLayerPath: string | null, nextUpper: { data: string; index: string }): Promise<string> {
    const r = await this.#call<"restack_snapshot">({ kind: "restack_snapshot", dev_id: id, output_layer_path: outputLayerPath, next_upper: nextUpper });
    return r.layer_path;
  }

  /**
   * Grow device `id` to `newSize` bytes (a multiple of 512); the VMM must then be told (QEMU:
   * QMP `block_resize`) for the guest to see it.
   * @returns the device's size afterwards
   * @throws DiskError `disk.bad_request` (shrinking), `disk.unsupported` (read-only, shared, or ublk), `disk.not_found`
   */
  async updateSize(id: string, newSize: number): Promise<number> {
    return (await this.#call<"update_size">({ kind: "update_size", dev_id: id, new_size: newSize })).size;
  }

  /** Counters of device `id`. */
  async stats(id: string): Promise<DeviceStats> {
    return (await this.#call<"stats">({ kind: "stats", dev_id: id })).stats;
  }

  /** Devices the daemon serves. */
  async list(): Promise<DeviceInfo[]> {
    return (await this.#call<"list">({ kind: "list" })).devices;
  }

  /** Send any request (tests, tools). */
  request<K extends Request["kind"]>(req: Extract<Req, { kind: K }>): Promise<Answer<K>> {
    return this.#call(req);
  }

  /**
   * The node is shutting down: a daemon that exits from now on is not started again. Call first
   * in the node's shutdown, before VMs are stopped and disks closed.
   */
  beginShutdown(): void {
    this.#stopping = true;
  }

  /**
   * Remove every device this node holds and stop the daemon (shutdown request; SIGTERM then
   * SIGKILL after `stopTimeoutMs` each). Idempotent.
   */
  close(): Promise<void> {
    return (this.#closed ??= (async () => {
      this.#stopping = true;
      if (!this.#started) return;
      await this.#started.catch(() => undefined);
      await this.#ready.catch(() => undefined);
      const proc = this.#proc;
      if (!proc) return;
      if (proc.running) {
        try {
          await this.#client.request({ kind: "shutdown" });
        } catch (e) {
          log.warn({ err: e }, "disk daemon shutdown request failed");
        }
        this.#client.close();
        const term = setTimeout(() => proc.kill("SIGTERM"), this.config.stopTimeoutMs);
        const kill = setTimeout(() => proc.kill("SIGKILL"), 2 * this.config.stopTimeoutMs);
        await proc.exited;
        clearTimeout(term);
        clearTimeout(kill);
      }
      for (const [id, fd] of this.#held) this.#drop(id, fd, null);
    })());
  }

  /**
   * Let go of the daemon without stopping it (the node hands it to the next node, which adopts
   * it: issue 27's detach): no restart from now on, the connection and this node's copies of
   * the FUSE connections close, every device stays (the daemon holds its own connections).
   * The service is unusable afterwards.
   */
  detach(): void {
    this.#stopping = true;
    this.#closed ??= Promise.resolve();
    if (!this.#proc) return;
    this.#client?.close();
    this.#proc.release();
    for (const fd of this.#held.values()) closeSync(fd);
    this.#held.clear();
  }

  // ---- internals ----

  async #call<K extends Request["kind"]>(req: Extract<Req, { kind: K }>): Promise<Answer<K>> {
    if (this.#closed) throw new DiskError("disk.daemon_unavailable", "the disk service is closed", { kind: req.kind });
    await this.start();
    await this.#ready;
    if (this.#dead) throw this.#dead;
    return this.#client.request<K>(req);
  }

  /** Hold a copy of a FUSE device's connection and tell the daemon, then wrap it as a handle. */
  async #adopt(info: DeviceInfo, fromPool: boolean, how: "delete" | "release"): Promise<DiskExport> {
    if (info.fuse_fd !== undefined && !this.#held.has(info.dev_id)) {
      const fd = takeFd(this.#proc.pid, info.fuse_fd);
      this.#held.set(info.dev_id, fd);
      await this.#call<"hold">({ kind: "hold", dev_id: info.dev_id, holder_pid: process.pid, holder_fd: fd });
    }
    this.#refs.set(info.dev_id, (this.#refs.get(info.dev_id) ?? 0) + 1);
    if (info.engine === "fuse") this.#mounts.set(info.dev_id, dirname(info.path));
    let closed: Promise<void> | undefined;
    const id = info.dev_id;
    let onLost!: (reason: string) => void;
    const lost = new Promise<string>((r) => (onLost = r));
    const waiters = this.#lostWaiters.get(id) ?? new Set();
    waiters.add(onLost);
    this.#lostWaiters.set(id, waiters);
    return {
      id, path: info.path, engine: info.engine, access: info.access, fromPool, lost,
      stats: () => this.stats(id),
      close: () =>
        (closed ??= (async () => {
          const w = this.#lostWaiters.get(id);
          w?.delete(onLost);
          if (w?.size === 0) this.#lostWaiters.delete(id);
          let gone = true;
          try {
            if (how === "delete") await this.#call<"delete">({ kind: "delete", dev_id: id });
            else gone = (await this.#call<"release">({ kind: "release", dev_id: id })).refcount === 0;
          } catch (e) {
            // a daemon that is gone for good cannot remove it: detach the mount here
            if (!(e instanceof DiskError) || (e.code !== "disk.daemon_failed" && e.code !== "disk.daemon_unavailable" && e.code !== "disk.not_found")) throw e;
            log.warn({ id, err: e }, "device removed without the daemon");
          }
          const refs = (this.#refs.get(id) ?? 1) - 1;
          if (refs > 0) this.#refs.set(id, refs);
          else this.#refs.delete(id);
          if (gone || refs === 0) this.#drop(id, this.#held.get(id), info.engine === "fuse" ? dirname(info.path) : null);
        })()),
    };
  }

  /** Device `id` is gone without this node asking: tell every handle of it. */
  #deviceLost(id: string, reason: string): void {
    const w = this.#lostWaiters.get(id);
    if (!w) return;
    this.#lostWaiters.delete(id);
    log.error({ id, reason }, "disk device lost");
    // nobody serves it any more: release the connection so pending and later I/O fail now
    this.#drop(id, this.#held.get(id), this.#mounts.get(id) ?? null);
    for (const f of w) f(reason);
  }

  /** After a restart: every device this node holds that the new daemon does not serve is lost. */
  async #checkServed(client: DaemonClient): Promise<void> {
    const ids = [...this.#lostWaiters.keys()];
    if (ids.length === 0) return;
    const r = await client.request<"list">({ kind: "list" });
    const served = new Set(r.devices.map((d) => d.dev_id));
    const why = new Map(r.lost.map((l) => [l.dev_id, l.reason]));
    for (const id of ids) if (!served.has(id)) this.#deviceLost(id, why.get(id) ?? "the restarted disk daemon does not serve it");
  }

  #drop(id: string, fd: number | undefined, mountPoint: string | null): void {
    if (mountPoint) umount2(mountPoint, MNT_DETACH);
    if (fd !== undefined) closeSync(fd);
    this.#held.delete(id);
    if (!this.#refs.has(id)) this.#mounts.delete(id);
  }

  /**
   * Adopt mode: keep a daemon a previous node left if it answers with this protocol version.
   * @returns false when there is none to keep (the caller shuts down what is left and spawns)
   */
  async #adoptLeftover(): Promise<boolean> {
    const paths = daemonPaths(this.dir);
    if (!existsSync(paths.socket)) return false;
    let client: DaemonClient;
    try {
      client = await DaemonClient.connect(paths.socket, { timeoutMs: this.config.requestTimeoutMs, maxFrameBytes: this.config.maxFrameBytes });
    } catch (e) {
      log.debug({ err: e }, "no disk daemon left to adopt");
      return false;
    }
    try {
      const f = await client.request({ kind: "get_features" });
      if (f.protocol !== DISK_PROTOCOL_VERSION) {
        log.warn({ pid: f.pid, protocol: f.protocol ?? null, want: DISK_PROTOCOL_VERSION }, "the disk daemon left by an earlier run speaks another protocol: not adopted");
        client.close();
        return false;
      }
      const start = processStartTime(f.pid);
      const held = start !== null && isDaemon(f.pid, this.dir) ? holdProcess(f.pid, start) : null;
      if (!held) {
        client.close();
        return false;
      }
      client.onLost = (l) => this.#deviceLost(l.dev_id, l.reason);
      this.#proc = adoptedDaemon(held);
      this.#client = client;
      this.#adopted = true;
      this.#watch(this.#proc);
      await this.#noteClaimable();
      log.info({ pid: f.pid, version: f.version, devices: this.#claimable.size, lost: this.#lostAtStart.size }, "adopted the disk daemon of an earlier run");
      return true;
    } catch (e) {
      log.warn({ err: e }, "the disk daemon left by an earlier run did not answer: not adopted");
      client.close();
      return false;
    }
  }

  /** Adopt mode: remember the devices the daemon serves and nobody claimed whole yet, and those it lost. */
  async #noteClaimable(): Promise<void> {
    const r = await this.#client.request<"list">({ kind: "list" });
    this.#claimableAt = this.#restarts;
    this.#claimable.clear();
    for (const d of r.devices) if ((this.#refs.get(d.dev_id) ?? 0) < d.refcount) this.#claimable.set(d.dev_id, d);
    for (const l of r.lost) this.#lostAtStart.set(l.dev_id, l.reason);
  }

  /** Start a daemon, wait for its ready line, connect. */
  async #spawn(): Promise<void> {
    const paths = daemonPaths(this.dir);
    const logFd = openSync(paths.log, "a");
    let proc: ReturnType<typeof Bun.spawn>;
    try {
      const settings = JSON.stringify(daemonSettings(this.config, this.dir));
      proc = Bun.spawn([...agentenvCommand(), "ublk-daemon", "--dir", this.dir, "--settings", settings], {
        stdio: ["ignore", "pipe", logFd], env: process.env, detached: true,
      });
    } finally {
      closeSync(logFd);
    }
    const fail = async (why: string): Promise<never> => {
      proc.kill("SIGKILL");
      await proc.exited;
      throw new DiskError("disk.daemon_failed", `disk daemon ${why}`, { dir: this.dir, exitCode: proc.exitCode, log: tail(paths.log) });
    };
    const line = await readLine(proc, this.config.readyTimeoutMs);
    if (line === null) return await fail(`not ready after ${this.config.readyTimeoutMs} ms (or exited)`);
    if (!line.startsWith("ready ")) return await fail(`sent an unexpected line ${JSON.stringify(line)}`);
    let client: DaemonClient;
    try {
      client = await DaemonClient.connect(paths.socket, { timeoutMs: this.config.requestTimeoutMs, maxFrameBytes: this.config.maxFrameBytes });
    } catch (e) {
      return await fail(`does not accept connections: ${errorMessage(e)}`);
    }
    client.onLost = (l) => this.#deviceLost(l.dev_id, l.reason);
    this.#proc = spawnedDaemon(proc);
    this.#client = client;
    log.debug({ pid: proc.pid, dir: this.dir }, "disk daemon started");
    this.#watch(this.#proc);
  }

  /** Start the daemon again when it dies, while restarts are left and the node is not stopping. */
  #watch(proc: DaemonProcess): void {
    void proc.exited.then(() => {
      if (this.#closed || this.#proc !== proc) return;
      this.#client.close();
      if (this.#stopping) {
        log.info({ pid: proc.pid, exitCode: proc.exitCode }, "disk daemon stopped");
        this.#dead = new DiskError("disk.daemon_failed", "the disk daemon stopped while the node shuts down", { pid: proc.pid });
        return;
      }
      // exit code 0: stopped from outside (SIGTERM/SIGINT), devices left intact for the next one
      const how = proc.exitCode === 0 ? "disk daemon stopped from outside" : "disk daemon died";
      (proc.exitCode === 0 ? log.warn : log.error).call(log, { pid: proc.pid, exitCode: proc.exitCode, signal: proc.signalCode, restarts: this.#restarts }, how);
      this.#ready = (async () => {
        while (this.#attempts < this.config.maxRestarts && !this.#stopping) {
          this.#attempts++;
          try {
            await this.#spawn();
            this.#restarts++;
            log.warn({ pid: this.#proc.pid, restarts: this.#restarts }, "disk daemon started again");
            // before any other request goes through (they wait for #ready)
            await this.#checkServed(this.#client).catch((e) => log.error({ err: e }, "checking the devices after a daemon restart failed"));
            return;
          } catch (e) {
            log.error({ err: e, attempts: this.#attempts }, "disk daemon restart failed");
          }
        }
        this.#dead = new DiskError("disk.daemon_failed", `the disk daemon died and ${this.config.maxRestarts} restarts are used up`, { dir: this.dir, restarts: this.#restarts });
      })();
    });
  }
}
