/**
 * A volume's filesystem on the node itself, for the content API while no sandbox writes it: the
 * disk service serves the volume image as a file (`<workDir>/mnt/volume.img`) and mount(8) mounts
 * that file's ext4 through a loop device at `<workDir>/fs` (nosuid, nodev, noexec; `ro,noload`
 * for read-only access beside read-only guests). Also the journal repair that must precede
 * read-only mounts (`e2fsck -p` on the served file), and start-up reaping of such mounts.
 */
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { listMounts, MNT_DETACH, umount2 } from "../ffi/mount.ts";
import { logger } from "../observability/log.ts";
import type { DiskExport, DiskService } from "../storage/daemon/index.ts";
import { VolumeError } from "./errors.ts";
import { volumeTarget, type VolumePaths } from "./image.ts";

const log = logger("volume");
/** Name of the served image file inside the export's mount. */
export const VOLUME_FILE = "volume.img";

/** Where and how to serve one volume for the node. */
export interface HostVolumeOptions {
  /** Volume id (names the export: `vol-<id>`). */
  id: string;
  paths: VolumePaths;
  /** Directory of this host access (`<runtime_path>/volumes/<id>`), made if missing. */
  workDir: string;
  /** The node's disk daemon: serves the volume image. */
  disks: DiskService;
}

function run(argv: string[]): { code: number; out: string } {
  const r = Bun.spawnSync(argv, { stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode ?? -1, out: (r.stderr.toString() + r.stdout.toString()).trim() };
}

async function serve(o: HostVolumeOptions, readOnly: boolean): Promise<DiskExport> {
  mkdirSync(o.workDir, { recursive: true });
  return o.disks.exportDisk({ id: `vol-${o.id}`, target: volumeTarget(o.paths, readOnly), mountPoint: join(o.workDir, "mnt"), fileName: VOLUME_FILE });
}

/** A volume mounted on the node. Close it before any sandbox attaches the volume. */
export class HostVolume {
  private closed = false;

  private constructor(
    /** The mounted filesystem's root directory. */
    readonly root: string,
    readonly readOnly: boolean,
    private readonly disk: DiskExport,
  ) {}

  /**
   * Serve and mount volume `o.id`. A writable mount replays the journal a killed writer left.
   * @throws VolumeError `volume.mount_failed` (mount's message); DiskError from serving the image
   */
  static async open(o: HostVolumeOptions, readOnly: boolean): Promise<HostVolume> {
    const disk = await serve(o, readOnly);
    const root = join(o.workDir, "fs");
    mkdirSync(root, { recursive: true });
    const opts = ["loop", "nosuid", "nodev", "noexec", ...(readOnly ? ["ro", "noload"] : [])].join(",");
    const m = run(["mount", "-t", "ext4", "-o", opts, disk.path, root]);
    if (m.code !== 0) {
      await disk.close();
      throw new VolumeError("volume.mount_failed", `mounting volume ${o.id} on the node failed: ${m.out}`, { volumeId: o.id, exitCode: m.code });
    }
    log.debug({ volumeId: o.id, root, readOnly }, "volume mounted on the node");
    return new HostVolume(root, readOnly, disk);
  }

  /** Unmount (lazily when busy) and stop serving the image. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (run(["umount", this.root]).code !== 0) umount2(this.root, MNT_DETACH);
    await this.disk.close();
    rmSync(this.root, { recursive: true, force: true });
  }
}

/**
 * Replay the journal and fix what a killed writer left (`e2fsck -p`), so read-only mounts (which
 * cannot replay it) see a consistent filesystem. Cheap on a clean filesystem.
 * @throws VolumeError `volume.fsck_failed` when e2fsck reports errors it could not correct (exit >= 4)
 */
export async function repairVolume(o: HostVolumeOptions): Promise<void> {
  const disk = await serve(o, false);
  try {
    const r = run(["e2fsck", "-p", disk.path]);
    // 0 clean, 1 errors corrected, 2 corrected (a running system would reboot)
    if (r.code > 2) throw new VolumeError("volume.fsck_failed", `e2fsck of volume ${o.id} exited ${r.code}: ${r.out}`, { volumeId: o.id, exitCode: r.code });
    if (r.code > 0) log.info({ volumeId: o.id, exitCode: r.code }, "volume journal replayed / repaired");
  } finally {
    await disk.close();
  }
}

/**
 * Unmount the ext4 filesystems a crashed node left mounted under `workRoot` (the FUSE exports
 * below them are the disk service's to reap). Call at start, before disks are reaped.
 * @returns the mount points detached
 */
export function reapHostVolumes(workRoot: string): string[] {
  const prefix = workRoot.replace(/\/+$/, "") + "/";
  const out: string[] = [];
  for (const m of listMounts()) {
    if (m.fstype !== "ext4" || !m.mountPoint.startsWith(prefix)) continue;
    if (umount2(m.mountPoint, MNT_DETACH) === 0) out.push(m.mountPoint);
  }
  return out;
}
