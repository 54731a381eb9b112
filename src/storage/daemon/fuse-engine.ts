/**
 * The FUSE export engine: each device is a FUSE mount holding one file, served by this process's
 * `FuseReaderPool` (threads shared by every device) and one `FuseConnection`. The mount survives
 * this process while another process (the node: the device's holder) keeps a copy of the
 * connection fd; a restarted daemon takes a copy back from the holder with pidfd_getfd(2) and
 * asks the kernel to re-send what the dead one had read but not answered (FUSE_NOTIFY_RESEND),
 * so the guest sees a pause, not an error.
 *
 * engineState: { mount_points: string[] } — every place the mount is visible (a pre-created
 * export is mounted under the daemon's directory and bind-mounted where it is handed out).
 */
import { closeSync, mkdirSync, readlinkSync } from "node:fs";
import { listMounts, MNT_DETACH, umount2, bindMount } from "../../ffi/mount.ts";
import { takeFd } from "../../ffi/pidfd.ts";
import { processStartTime } from "../../ffi/proc.ts";
import { logger } from "../../observability/log.ts";
import type { BlockImage } from "../block.ts";
import { FUSE_FS_NAME, FuseConnection, FuseReaderPool, mountFuse, type DirectPlan } from "../fuse/index.ts";
import type { EngineDevice, EngineStats, ExportEngine, PlaceSpec } from "./engine.ts";
import { DiskError } from "../errors.ts";
import type { DeviceRow } from "./store.ts";
import { directPlanOf } from "./target.ts";

const log = logger("disk");

/** Settings of the FUSE engine (config `[disk]`). */
export interface FuseEngineSettings {
  /** Reader threads shared by every device. */
  threads: number;
  /** Largest READ/WRITE in bytes. */
  maxWrite: number;
  /** Kernel request timeout, seconds (0 = none). */
  requestTimeoutSec: number;
  /** Answer large READs with splice(2). */
  splice: boolean;
  /** Readahead window of each mount, KiB (0 = the kernel's). */
  readAheadKb: number;
}

class FuseDevice implements EngineDevice {
  readonly fuseFd: number;
  #conn: FuseConnection;
  #mountPoints: string[];
  #destroyed: Promise<void> | undefined;

  constructor(fd: number, conn: FuseConnection, mountPoints: string[]) {
    this.fuseFd = fd;
    this.#conn = conn;
    this.#mountPoints = mountPoints;
  }

  get path(): string | null {
    const p = this.#conn.path;
    // the file as seen at the last (handed-out) mount point
    return p === null ? null : p.replace(this.#conn.mountPoint, this.#mountPoints[this.#mountPoints.length - 1]!);
  }

  get engineState(): Record<string, unknown> {
    return { mount_points: [...this.#mountPoints] };
  }

  get image(): BlockImage | null {
    return this.#conn.image;
  }

  get ended(): Promise<string> {
    return this.#conn.ended;
  }

  stats(): EngineStats {
    return this.#conn.stats;
  }

  exclusive<T>(op: () => Promise<T>): Promise<T> {
    return this.#conn.exclusive(op);
  }

  refresh(direct: DirectPlan | undefined): void {
    this.#conn.replan(direct ?? null);
  }

  grow(newSize: number): Promise<void> {
    return this.#conn.grow(newSize, directPlanOf);
  }

  async bind(image: BlockImage, place: PlaceSpec): Promise<void> {
    this.#conn.bind({ fileName: place.fileName, image, directIo: place.directIo, direct: place.direct, acceptWritableOpen: place.acceptWritableOpen });
    if (place.mountPoint !== this.#mountPoints[0]) {
      mkdirSync(place.mountPoint, { recursive: true });
      bindMount(this.#mountPoints[0]!, place.mountPoint);
      this.#mountPoints.push(place.mountPoint);
      // the pre-created place is no longer needed: the bind keeps the filesystem alive
      umount2(this.#mountPoints.shift()!, MNT_DETACH);
    }
  }

  detach(): Promise<void> {
    return (this.#destroyed ??= (async () => {
      try {
        await this.#conn.close();
      } finally {
        closeSync(this.fuseFd);
      }
    })());
  }

  destroy(): Promise<void> {
    return (this.#destroyed ??= (async () => {
      // no new opens; in-flight requests are still answered by close() below
      for (const mp of this.#mountPoints) umount2(mp, MNT_DETACH);
      try {
        await this.#conn.close();
      } finally {
        closeSync(this.fuseFd);
      }
    })());
  }
}

/** The FUSE engine of one daemon. */
export class FuseEngine implements ExportEngine {
  readonly name = "fuse" as const;
  #pool: FuseReaderPool;
  #s: FuseEngineSettings;

  constructor(s: FuseEngineSettings) {
    this.#s = s;
    this.#pool = new FuseReaderPool({ threads: s.threads, bufSize: s.maxWrite + 4096, splice: s.splice });
  }

  /** @throws FuseError `fuse.open_device`, `fuse.mount`, `fuse.bad_options` */
  async create(image: BlockImage, place: PlaceSpec): Promise<EngineDevice> {
    const fd = mountFuse(place.mountPoint, this.#s.maxWrite);
    try {
      const conn = this.#connect(fd, place.mountPoint, false);
      conn.bind({ fileName: place.fileName, image, directIo: place.directIo, direct: place.direct, acceptWritableOpen: place.acceptWritableOpen });
      return new FuseDevice(fd, conn, [place.mountPoint]);
    } catch (e) {
      umount2(place.mountPoint, MNT_DETACH);
      closeSync(fd);
      throw e;
    }
  }

  async precreate(_devId: string, mountPoint: string): Promise<EngineDevice | null> {
    const fd = mountFuse(mountPoint, this.#s.maxWrite);
    try {
      return new FuseDevice(fd, this.#connect(fd, mountPoint, false), [mountPoint]);
    } catch (e) {
      umount2(mountPoint, MNT_DETACH);
      closeSync(fd);
      throw e;
    }
  }

  /**
   * Take the connection back from the row's holder and serve it again.
   * @throws DiskError `disk.daemon_failed` (no live holder, not a FUSE fd, mount gone); SyscallError from pidfd_getfd
   */
  async recover(row: DeviceRow, image: BlockImage, place: PlaceSpec): Promise<EngineDevice> {
    const h = row.holder;
    const mountPoints = mountPointsOf(row);
    const fail = (why: string) => new DiskError("disk.daemon_failed", `device ${row.devId} cannot be recovered: ${why}`, { devId: row.devId, holder: h });
    if (!h || processStartTime(h.pid) !== h.start) throw fail("no live holder of its connection");
    const live = new Set(listMounts().filter((m) => m.fstype === `fuse.${FUSE_FS_NAME}`).map((m) => m.mountPoint));
    const at = mountPoints[mountPoints.length - 1];
    if (!at || !live.has(at)) throw fail(`its mount ${at} is gone`);
    const fd = takeFd(h.pid, h.fd);
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`) !== "/dev/fuse") throw fail(`fd ${h.fd} of pid ${h.pid} is not /dev/fuse`);
      const conn = this.#connect(fd, at, true);
      conn.bind({ fileName: place.fileName, image, directIo: place.directIo, direct: place.direct, acceptWritableOpen: place.acceptWritableOpen });
      return new FuseDevice(fd, conn, [at]);
    } catch (e) {
      closeSync(fd);
      throw e;
    }
  }

  async cleanup(row: DeviceRow): Promise<void> {
    for (const mp of mountPointsOf(row)) {
      const rc = umount2(mp, MNT_DETACH);
      if (rc === 0) log.info({ devId: row.devId, mountPoint: mp }, "detached a FUSE mount left behind");
    }
  }

  async sweep(): Promise<string[]> {
    // nothing to find: a row names its mount point before the mount is made (cleanup unmounts it)
    return [];
  }

  async close(_opts: { detached: boolean }): Promise<void> {
    // detached or not, the mounts belong to their holders now: only the threads go
    await this.#pool.close();
  }

  #connect(fd: number, mountPoint: string, resume: boolean): FuseConnection {
    return new FuseConnection(this.#pool, { fd, mountPoint, maxWrite: this.#s.maxWrite, requestTimeoutSec: this.#s.requestTimeoutSec, readAheadKb: this.#s.readAheadKb, resume });
  }
}

function mountPointsOf(row: DeviceRow): string[] {
  const mps = row.engineState.mount_points;
  return Array.isArray(mps) ? mps.filter((m): m is string => typeof m === "string") : [];
}
