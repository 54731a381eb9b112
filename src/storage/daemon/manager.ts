/**
 * The daemon's devices: create, delete, shared (refcounted) and exclusive acquire/release with a
 * warm pool of pre-created exports, restack, holders, recovery after a restart. Every change is
 * written to the `DeviceStore` before it is announced; operations on one device (or one share
 * key) run one at a time.
 *
 * A handed-out device whose kernel object ends on its own (a FUSE connection aborted, a ublk
 * device stopped or its queues gone) or that a restarted daemon cannot serve again is *lost*: it
 * is removed, remembered with its reason (`lost()`, the `list` answer) and reported through
 * `ManagerOptions.onLost` (the daemon sends a `device_lost` event), so the node can fail the
 * sandbox using it.
 */
import { readdirSync, rmdirSync } from "node:fs";
import { join } from "node:path";
import { processStartTime } from "../../ffi/proc.ts";
import { logger } from "../../observability/log.ts";
import type { BlockImage } from "../block.ts";
import { LayeredImage } from "../overlaybd/index.ts";
import type { EngineDevice, ExportEngine, PlaceSpec } from "./engine.ts";
import { DiskError } from "../errors.ts";
import type { DeviceInfo, DeviceStats, EngineName, FuseSpec, Request, TargetSpec } from "./protocol.ts";
import type { DeviceRow, DeviceStore } from "./store.ts";
import { directPlanOf, openTarget } from "./target.ts";
import { LruMap } from "../../util/lru.ts";
import { errorCode, errorMessage } from "../../util/error.ts";

const log = logger("disk");

/** Warm pool settings (config `[pool.block]`). */
export interface BlockPoolSettings {
  enabled: boolean;
  /** Refill when fewer pre-created exports than this are left (per engine). */
  lowWatermark: number;
  /** Refill up to this many. */
  highWatermark: number;
}

/** What the manager needs. */
export interface ManagerOptions {
  store: DeviceStore;
  engines: Partial<Record<EngineName, ExportEngine>>;
  defaultEngine: EngineName;
  /** The daemon's directory: default mount points live under it. */
  dir: string;
  /** Default FOPEN_DIRECT_IO of FUSE files. */
  directIo: boolean;
  pool: BlockPoolSettings;
  /** Called when a handed-out device is lost (see the module comment). */
  onLost?: (lost: LostDevice) => void;
}

/** A handed-out device that is gone without a request. */
export interface LostDevice {
  devId: string;
  engine: EngineName;
  reason: string;
  /** ms since the epoch */
  at: number;
}

/** Lost devices remembered, oldest dropped first. */
const LOST_KEPT = 1024;

interface Live {
  row: DeviceRow;
  dev: EngineDevice;
  /** Times the image was opened for this device by this daemon (1, or 2+ after pool binds and recoveries). */
  imageOpens: number;
  /** Being destroyed or detached on request: its end is not a loss. */
  dropping?: boolean;
}

type Acquire = Extract<Request, { kind: "acquire" }>;
type Create = Extract<Request, { kind: "create_runtime_device" }>;

/** The device table of a running daemon. */
export class DeviceManager {
  #o: ManagerOptions;
  #live = new Map<string, Live>();
  #pool = new Map<EngineName, Live[]>();
  #locks = new Map<string, Promise<unknown>>();
  #refilling = new Map<EngineName, Promise<void>>();
  #nextPool = 1;
  #stopping = false;
  /** Devices lost, the oldest forgotten first past LOST_KEPT. */
  #lost = new LruMap<string, LostDevice>(LOST_KEPT);
  /** Devices served again after a restart (reported by get_features). */
  recovered = 0;

  constructor(o: ManagerOptions) {
    this.#o = o;
  }

  /** Engines available here. */
  get engines(): EngineName[] {
    return (Object.keys(this.#o.engines) as EngineName[]).filter((k) => this.#o.engines[k]);
  }

  /**
   * Serve every persisted device again, or clean it up: a device whose connection holder is gone,
   * whose image no longer opens, or a pre-created pool export (made again by the pool).
   * @returns how many were recovered and cleaned up
   */
  async recover(): Promise<{ recovered: string[]; cleaned: string[] }> {
    const recovered: string[] = [];
    const cleaned: string[] = [];
    const { rows, corrupt } = this.#o.store.all();
    for (const c of corrupt) {
      // its kernel objects and mount points are swept below with those no record names
      log.warn({ devId: c.devId, problem: c.problem }, "device record is corrupt: dropped");
      this.#o.store.delete(c.devId);
      cleaned.push(c.devId);
    }
    for (const row of rows) {
      const engine = this.#o.engines[row.engine];
      if (row.access === "pool") {
        // nobody else holds a pre-created export's connection: it is gone; the pool makes new ones
        await engine?.cleanup(row);
        this.#o.store.delete(row.devId);
        removeEmptyDir(join(this.#o.dir, "pool", row.devId));
        continue;
      }
      let image: BlockImage | undefined;
      try {
        if (!engine) throw new DiskError("disk.unsupported", `engine ${row.engine} is not available`, { engine: row.engine });
        // the upper exists by now: never create one again on recovery
        const target: TargetSpec = row.target.kind === "overlaybd" ? { ...row.target, create_upper_size: undefined } : row.target;
        image = await openTarget(target);
        const dev = await engine.recover(row, image, this.#place(row.devId, row.fuse, row.target, image));
        const live: Live = { row: { ...row, engineState: dev.engineState, path: dev.path ?? row.path }, dev, imageOpens: 1 };
        this.#o.store.put(live.row);
        this.#live.set(row.devId, live);
        this.#watch(live);
        recovered.push(row.devId);
      } catch (e) {
        await image?.close().catch(() => undefined);
        await engine?.cleanup(row);
        this.#o.store.delete(row.devId);
        cleaned.push(row.devId);
        log.warn({ devId: row.devId, err: e }, "device not recovered: cleaned up");
        this.#remember({ devId: row.devId, engine: row.engine, reason: `not recovered after a daemon restart: ${errorMessage(e)}`, at: Date.now() });
      }
    }
    // kernel objects earlier daemons made but never recorded (a crash right after making one)
    const recorded = this.#o.store.all().rows;
    for (const name of this.engines) {
      const swept = await this.#o.engines[name]!.sweep(recorded).catch((e) => (log.warn({ engine: name, err: e }, "sweep of unrecorded devices failed"), []));
      if (swept.length) log.warn({ engine: name, swept }, "removed devices no record names");
    }
    // mount points earlier daemons made and left empty (a stop between unmount and rmdir)
    this.removeEmptyMountPoints();
    this.recovered += recovered.length;
    if (recovered.length || cleaned.length) log.info({ recovered, cleaned }, "device recovery done");
    return { recovered, cleaned };
  }

  /** Devices lost since this daemon started (see the module comment), oldest first. */
  lost(): LostDevice[] {
    return [...this.#lost.values()];
  }

  /** Fill each engine's warm pool to its low watermark (at start). */
  async prefill(): Promise<void> {
    for (const name of this.engines) await this.#fill(name, this.#o.pool.lowWatermark);
  }

  /**
   * Export `target` as a new device.
   * @throws DiskError `disk.exists`, `disk.unsupported`, `disk.open_failed`, `disk.busy`; engine errors
   */
  create(req: Create): Promise<DeviceInfo> {
    return this.#lock(`dev:${req.dev_id}`, () => this.#create(req.dev_id, req.engine, req.target, req.fuse ?? {}, "exclusive", null));
  }

  /**
   * Exclusive: a device for one sandbox, bound to a pre-created export of the warm pool when one
   * is ready. Shared: the read-only device of `share_key`, created on first use, refcounted.
   * @returns the device and whether it came from the pool
   */
  acquire(req: Acquire): Promise<DeviceInfo & { from_pool: boolean }> {
    if (req.access_mode === "shared") {
      const key = req.share_key!;
      return this.#lock(`share:${key}`, async () => {
        const existing = [...this.#live.values()].find((l) => l.row.shareKey === key);
        if (existing) {
          existing.row.refcount++;
          this.#o.store.put(existing.row);
          return { ...this.#info(existing), from_pool: false };
        }
        const fuse: FuseSpec = { mount_point: join(this.#o.dir, "shared", key), ...req.fuse };
        return { ...(await this.#create(`shared.${key}`, req.engine, req.target, fuse, "shared", key)), from_pool: false };
      });
    }
    const devId = req.dev_id!;
    return this.#lock(`dev:${devId}`, async () => {
      const engineName = req.engine ?? this.#o.defaultEngine;
      const pooled = this.#pool.get(engineName)?.shift();
      if (!pooled) {
        const info = await this.#create(devId, req.engine, req.target, req.fuse ?? {}, "exclusive", null);
        this.#refill(engineName);
        return { ...info, from_pool: false };
      }
      this.#refill(engineName);
      try {
        return { ...(await this.#bindPooled(devId, pooled, req.target, req.fuse ?? {})), from_pool: true };
      } catch (e) {
        log.warn({ devId, err: e }, "binding a pre-created export failed: creating one");
        await this.#drop(pooled);
        return { ...(await this.#create(devId, req.engine, req.target, req.fuse ?? {}, "exclusive", null)), from_pool: false };
      }
    });
  }

  /**
   * Drop one reference: a shared device goes when its last user releases it, an exclusive one
   * at once.
   * @throws DiskError `disk.not_found`
   */
  release(devId: string): Promise<{ refcount: number }> {
    const l = this.#get(devId, true);
    const key = l.row.shareKey !== null ? `share:${l.row.shareKey}` : `dev:${devId}`;
    return this.#lock(key, async () => {
      const live = this.#get(devId);
      if (live.row.refcount <= 0) throw new DiskError("disk.internal", `device ${devId} has refcount ${live.row.refcount}`, { devId });
      live.row.refcount--;
      if (live.row.refcount === 0) {
        await this.#drop(live);
        return { refcount: 0 };
      }
      this.#o.store.put(live.row);
      return { refcount: live.row.refcount };
    });
  }

  /**
   * Remove a device whatever its refcount (its users must be gone).
   * @throws DiskError `disk.not_found`
   */
  delete(devId: string): Promise<void> {
    return this.#lock(`dev:${devId}`, async () => this.#drop(this.#get(devId, true)));
  }

  /**
   * Seal the device's upper into a new read-only layer (`outputLayerPath`, or in place when
   * null) and continue on a fresh upper at `nextUpper`, between two writes.
   * @throws DiskError `disk.not_found`, `disk.unsupported` (not an overlaybd stack with an upper); OverlaybdError
   */
  restack(devId: string, outputLayerPath: string | null, nextUpper: { data: string; index: string }): Promise<{ layerPath: string; layers: number; ms: number }> {
    return this.#lock(`dev:${devId}`, async () => {
      const live = this.#get(devId);
      const img = live.dev.image;
      const t = live.row.target;
      if (!(img instanceof LayeredImage) || !img.writable || t.kind !== "overlaybd") {
        throw new DiskError("disk.unsupported", `device ${devId} is not an overlaybd stack with an upper`, { devId });
      }
      const t0 = performance.now();
      const layerPath = await live.dev.exclusive(() => img.restack(outputLayerPath, nextUpper));
      live.dev.refresh(directPlanOf(img));
      live.row.target = { ...t, lowers: [...t.lowers, layerPath], upper: nextUpper, create_upper_size: undefined };
      this.#o.store.put(live.row);
      return { layerPath, layers: img.lowers.length, ms: Math.round(performance.now() - t0) };
    });
  }

  /**
   * Grow a device to `newSize` bytes (durably: the upper's headers, or the raw file's length).
   * The VMM must then be told (QEMU: QMP `block_resize`) for the guest to see it.
   * @returns the device's size afterwards
   * @throws DiskError `disk.not_found`; `disk.bad_request` (below the current size: shrinking
   *   loses data); `disk.unsupported` (a read-only or shared device, or an engine that cannot
   *   resize a live device: ublk)
   */
  updateSize(devId: string, newSize: number): Promise<number> {
    return this.#lock(`dev:${devId}`, async () => {
      const live = this.#get(devId);
      const img = live.dev.image;
      if (img && newSize === img.size) return newSize;
      if (img && newSize < img.size) {
        throw new DiskError("disk.bad_request", `device ${devId}: shrinking from ${img.size} to ${newSize} bytes would lose data`, { field: "new_size", value: newSize, size: img.size });
      }
      if (!img || img.readOnly || !img.grow || live.row.access === "shared") {
        throw new DiskError("disk.unsupported", `device ${devId} is read-only or cannot grow`, { devId, engine: live.row.engine, size: img?.size ?? null, newSize });
      }
      await live.dev.grow(newSize);
      log.info({ devId, from: img.size, to: newSize }, "device grown");
      return img.size;
    });
  }

  /**
   * Record that process `pid` keeps fd `fd`, a copy of the device's FUSE connection: a restarted
   * daemon takes the connection back from it.
   * @throws DiskError `disk.not_found`, `disk.bad_request` (pid not running)
   */
  hold(devId: string, pid: number, fd: number): void {
    const live = this.#get(devId);
    const start = processStartTime(pid);
    if (start === null) throw new DiskError("disk.bad_request", `holder pid ${pid} is not running`, { field: "holder_pid", value: pid });
    live.row.holder = { pid, fd, start };
    this.#o.store.put(live.row);
  }

  /** Every handed-out device. */
  list(): DeviceInfo[] {
    return [...this.#live.values()].map((l) => this.#info(l));
  }

  /** @throws DiskError `disk.not_found` */
  stats(devId: string): DeviceStats {
    const l = this.#get(devId);
    const s = l.dev.stats();
    return {
      reads: s.reads, bytes_read: s.bytesRead, writes: s.writes, bytes_written: s.bytesWritten, fsyncs: s.fsyncs,
      discards: s.discards, opens: s.opens, errors: s.errors, spliced_reads: s.splicedReads, image_opens: l.imageOpens, refcount: l.row.refcount,
    };
  }

  /** Pre-created exports ready per engine. */
  pooled(engine: EngineName): number {
    return this.#pool.get(engine)?.length ?? 0;
  }

  /**
   * Destroy every device (handed out and pre-created) and forget them: a clean shutdown.
   * Later requests fail with `disk.busy`.
   */
  async shutdown(): Promise<void> {
    this.#stopping = true;
    await Promise.allSettled([...this.#refilling.values()]);
    await Promise.allSettled([...this.#locks.values()]);
    for (const l of [...this.#live.values()]) await this.#drop(l).catch((e) => log.error({ devId: l.row.devId, err: e }, "device destroy failed"));
    for (const list of this.#pool.values()) for (const l of list.splice(0)) await this.#drop(l).catch(() => undefined);
    this.removeEmptyMountPoints();
  }

  /**
   * Remove the empty directories under `<dir>/pool/` and `<dir>/shared/`: the mount points the
   * daemon made for pre-created and shared exports. A live mount point (EBUSY) or a directory
   * with content stays; call it when no export is being created (start, shutdown).
   */
  removeEmptyMountPoints(): void {
    for (const sub of ["pool", "shared"]) {
      let names: string[];
      try {
        names = readdirSync(join(this.#o.dir, sub));
      } catch {
        continue; // never made
      }
      for (const n of names) removeEmptyDir(join(this.#o.dir, sub, n));
    }
  }

  /**
   * Stop serving every device but keep it (rows and kernel objects) for a restarted daemon;
   * pre-created exports, which nobody else holds, are destroyed.
   */
  async detachAll(): Promise<void> {
    this.#stopping = true;
    await Promise.allSettled([...this.#refilling.values()]);
    await Promise.allSettled([...this.#locks.values()]);
    for (const l of this.#live.values()) await l.dev.detach().catch((e) => log.error({ devId: l.row.devId, err: e }, "device detach failed"));
    this.#live.clear();
    for (const list of this.#pool.values()) for (const l of list.splice(0)) await this.#drop(l).catch(() => undefined);
  }

  // ---- internals ----

  /** The live device `devId`; `forget`: a lost one's record goes with this (failed) lookup. */
  #get(devId: string, forget = false): Live {
    const l = this.#live.get(devId);
    if (!l) {
      const lost = this.#lost.peek(devId);
      if (forget) this.#lost.delete(devId);
      throw new DiskError("disk.not_found", lost ? `device ${devId} was lost: ${lost.reason}` : `no device ${devId}`, { devId, ...(lost ? { lost: lost.reason } : {}) });
    }
    return l;
  }

  /** Remember a lost device (bounded) and report it. */
  #remember(lost: LostDevice): void {
    this.#lost.set(lost.devId, lost);
    log.error({ devId: lost.devId, engine: lost.engine, reason: lost.reason }, "device lost");
    try {
      this.#o.onLost?.(lost);
    } catch (e) {
      log.error({ err: e }, "lost-device listener failed");
    }
  }

  /** When a handed-out device's kernel object ends without a request: the device is lost. */
  #watch(l: Live): void {
    void l.dev.ended.then((reason) => {
      if (l.dropping || this.#stopping || this.#live.get(l.row.devId) !== l) return;
      l.dropping = true;
      this.#live.delete(l.row.devId);
      this.#o.store.delete(l.row.devId);
      this.#remember({ devId: l.row.devId, engine: l.row.engine, reason: `its ${l.row.engine} device stopped being served: ${reason}`, at: Date.now() });
      // release what is left of it (ublk: DEL_DEV once every opener closed it; FUSE: the mount)
      void l.dev.destroy().catch((e) => log.warn({ devId: l.row.devId, err: e }, "removing a lost device failed"));
    });
  }

  #info(l: Live): DeviceInfo {
    const r = l.row;
    return {
      dev_id: r.devId, engine: r.engine, path: l.dev.path ?? r.path, access: r.access === "shared" ? "shared" : "exclusive", refcount: r.refcount,
      ...(l.dev.fuseFd !== undefined ? { fuse_fd: l.dev.fuseFd } : {}),
    };
  }

  #engine(name: EngineName | undefined): ExportEngine {
    const n = name ?? this.#o.defaultEngine;
    const e = this.#o.engines[n];
    if (!e) throw new DiskError("disk.unsupported", `engine ${n} is not available on this host`, { engine: n, available: this.engines });
    return e;
  }

  #place(devId: string, fuse: FuseSpec, target: TargetSpec, image: BlockImage): PlaceSpec {
    return {
      devId,
      mountPoint: fuse.mount_point ?? join(this.#o.dir, "mnt", devId),
      fileName: fuse.file_name ?? "disk.img",
      directIo: fuse.direct_io ?? this.#o.directIo,
      acceptWritableOpen: target.accept_writable_open === true,
      direct: directPlanOf(image),
    };
  }

  async #create(devId: string, engineName: EngineName | undefined, target: TargetSpec, fuse: FuseSpec, access: "exclusive" | "shared", shareKey: string | null): Promise<DeviceInfo> {
    if (this.#stopping) throw new DiskError("disk.busy", "the daemon is shutting down", { devId });
    if (this.#live.has(devId)) throw new DiskError("disk.exists", `device ${devId} exists`, { devId });
    const engine = this.#engine(engineName);
    const image = await openTarget(target);
    const place = this.#place(devId, fuse, target, image);
    const row: DeviceRow = {
      devId, engine: engine.name, target, fuse, path: `${place.mountPoint}/${place.fileName}`, access, shareKey, refcount: 1,
      engineState: { mount_points: [place.mountPoint] }, holder: null, createdAt: Date.now(),
    };
    // the row first: a crash from here on leaves something recovery can clean up
    this.#o.store.put(row);
    let dev: EngineDevice;
    try {
      dev = await engine.create(image, place);
    } catch (e) {
      this.#o.store.delete(devId);
      await image.close().catch(() => undefined);
      throw e;
    }
    const live: Live = { row: { ...row, engineState: dev.engineState, path: dev.path ?? row.path }, dev, imageOpens: 1 };
    this.#o.store.put(live.row);
    this.#live.set(devId, live);
    this.#lost.delete(devId);
    this.#watch(live);
    log.debug({ devId, engine: engine.name, path: live.row.path, access }, "device created");
    return this.#info(live);
  }

  async #bindPooled(devId: string, pooled: Live, target: TargetSpec, fuse: FuseSpec): Promise<DeviceInfo> {
    if (this.#live.has(devId)) throw new DiskError("disk.exists", `device ${devId} exists`, { devId });
    const t0 = performance.now();
    const image = await openTarget(target);
    const place = this.#place(devId, fuse, target, image);
    try {
      await pooled.dev.bind(image, place);
    } catch (e) {
      await image.close().catch(() => undefined);
      throw e;
    }
    this.#o.store.delete(pooled.row.devId);
    // bind() moved the export to the sandbox's mount point: the pre-created one is empty now
    if (pooled.row.access === "pool") removeEmptyDir(join(this.#o.dir, "pool", pooled.row.devId));
    const live: Live = {
      row: { ...pooled.row, devId, target, fuse, path: pooled.dev.path!, access: "exclusive", refcount: 1, engineState: pooled.dev.engineState, createdAt: Date.now() },
      dev: pooled.dev,
      imageOpens: 1,
    };
    this.#o.store.put(live.row);
    this.#live.set(devId, live);
    this.#lost.delete(devId);
    this.#watch(live);
    log.debug({ devId, path: live.row.path, pooled: pooled.row.devId, ms: Math.round(performance.now() - t0) }, "device bound from the warm pool");
    return this.#info(live);
  }

  async #drop(l: Live): Promise<void> {
    l.dropping = true;
    try {
      await l.dev.destroy();
    } finally {
      this.#o.store.delete(l.row.devId);
      if (this.#live.get(l.row.devId) === l) this.#live.delete(l.row.devId);
    }
    // a pre-created export's mount point is its own (pool ids are never reused)
    if (l.row.access === "pool") removeEmptyDir(join(this.#o.dir, "pool", l.row.devId));
  }

  /** Refill `engine`'s pool to the high watermark in the background when it fell below the low one. */
  #refill(engine: EngineName): void {
    const p = this.#o.pool;
    if (!p.enabled || this.#stopping || this.#refilling.has(engine) || this.pooled(engine) >= p.lowWatermark) return;
    const run = this.#fill(engine, p.highWatermark)
      .catch((e) => log.warn({ engine, err: e }, "warm pool refill failed"))
      .finally(() => this.#refilling.delete(engine));
    this.#refilling.set(engine, run);
  }

  async #fill(name: EngineName, upTo: number): Promise<void> {
    const engine = this.#o.engines[name];
    if (!engine || !this.#o.pool.enabled) return;
    const list = this.#pool.get(name) ?? [];
    this.#pool.set(name, list);
    while (!this.#stopping && list.length < upTo) {
      const devId = `pool-${process.pid}-${this.#nextPool++}`;
      const mountPoint = join(this.#o.dir, "pool", devId);
      const row: DeviceRow = {
        devId, engine: name, target: { kind: "raw", path: "/dev/null", read_only: true }, fuse: {}, path: "", access: "pool", shareKey: null,
        refcount: 0, engineState: { mount_points: [mountPoint] }, holder: null, createdAt: Date.now(),
      };
      this.#o.store.put(row);
      let dev: EngineDevice | null;
      try {
        dev = await engine.precreate(devId, mountPoint);
      } catch (e) {
        this.#o.store.delete(devId);
        throw e;
      }
      if (!dev) {
        this.#o.store.delete(devId);
        return;
      }
      row.engineState = dev.engineState;
      this.#o.store.put(row);
      list.push({ row, dev, imageOpens: 0 });
    }
  }

  /** Run `fn` after every earlier operation on `key` finished. */
  #lock<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#locks.get(key) ?? Promise.resolve();
    const run = prev.then(fn, fn);
    const tail = run.then(() => undefined, () => undefined);
    this.#locks.set(key, tail);
    void tail.then(() => {
      if (this.#locks.get(key) === tail) this.#locks.delete(key);
    });
    return run;
  }
}

/** rmdir `path` when it is an empty directory; a missing, busy (mounted) or non-empty one stays. */
function removeEmptyDir(path: string): void {
  try {
    rmdirSync(path);
  } catch (e) {
    const code = errorCode(e);
    if (code !== "ENOENT" && code !== "EBUSY" && code !== "ENOTEMPTY" && code !== "ENOTDIR") log.warn({ path, err: e }, "could not remove a mount point directory");
  }
}
