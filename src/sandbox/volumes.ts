/**
 * Volumes for the VM runtime: the `VolumeBackend` the orchestrator manages volumes through (disks
 * in `<home>/volumes/<id>/`, the node's own host mounts in `<runtime_path>/volumes/<id>/`, kept
 * `hostIdleMs` after their last use), and the two halves of attaching a volume to a VM: serving
 * its disk as an extra drive (`serveVolumeDrives`, one export per sandbox and volume, read-only
 * for readers; the drive's virtio serial is the volume id) and mounting it in the guest through
 * envd (`mountVolumesInGuest`: the device whose /sys/block/vdX/serial is the id).
 */
import { rmSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { logger } from "../observability/log.ts";
import type { GuestTarget, VolumeBackend } from "../orchestrator/runtime.ts";
import type { VolumeMount } from "../orchestrator/types.ts";
import type { DiskExport, DiskService } from "../storage/daemon/index.ts";
import { createVolumeImage, HostFiles, HostVolume, repairVolume, volumeTarget, volumePaths, VOLUME_FILE, type CreateDefaults, type HostVolumeOptions } from "../volume/index.ts";
import type { DriveSpec } from "../vmm/index.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { execInGuest } from "./guest-exec.ts";
import { envdUrl } from "./guest-start.ts";
import { GuestVolumeFiles } from "./guest-volume-files.ts";

/** Settings of the volume backend. */
export interface VmVolumesOptions {
  /** `<home>/volumes`: the disks. */
  volumesDir: string;
  /** `<runtime_path>/volumes`: the node's host mounts. */
  hostDir: string;
  /** The node's disk daemon: serves the volume images. */
  disks: DiskService;
  /** Owner and modes of what is created without explicit metadata (and of a new volume's root). */
  defaults: CreateDefaults;
  maxListEntries: number;
  hostIdleMs: number;
  /** Bound on one envd command of a guest-side file operation or mount, ms. */
  guestOpTimeoutMs: number;
}

interface Cached {
  mount: HostVolume;
  idle?: ReturnType<typeof setTimeout>;
  busy: number;
}

/** `VolumeBackend` of the VM runtime. */
export class VmVolumes implements VolumeBackend {
  private readonly host = new Map<string, Cached>();
  /** Node mounts being closed, by volume id: the next open of the volume waits for its close. */
  private readonly closing = new Map<string, Promise<void>>();
  /** Node mounts being opened, by volume id. */
  private readonly opening = new Map<string, Promise<Cached>>();
  private readonly log: Logger = logger("volume");

  constructor(readonly o: VmVolumesOptions) {}

  async create(id: string, name: string, sizeBytes: number): Promise<void> {
    await createVolumeImage(volumePaths(this.o.volumesDir, id), sizeBytes, this.o.defaults, name);
  }

  async destroy(id: string): Promise<void> {
    await this.releaseHost(id);
    rmSync(volumePaths(this.o.volumesDir, id).dir, { recursive: true, force: true });
    rmSync(join(this.o.hostDir, id), { recursive: true, force: true });
  }

  async prepareShared(id: string): Promise<void> {
    await this.releaseHost(id);
    await repairVolume(this.hostOptions(id));
  }

  async hostFiles(id: string, readOnly: boolean): Promise<{ files: HostFiles; release(): void }> {
    let c: Cached | undefined;
    for (;;) {
      c = this.host.get(id);
      if (c && c.mount.readOnly === readOnly) break;
      if (c) {
        await this.releaseHost(id);
        continue;
      }
      // an (idle) close still in flight holds the volume's device id in the disk daemon
      const closing = this.closing.get(id);
      if (closing) {
        await closing;
        continue;
      }
      // one open per volume at a time: concurrent first uses share it
      let opening = this.opening.get(id);
      if (!opening) {
        opening = HostVolume.open(this.hostOptions(id), readOnly)
          .then((mount) => {
            const entry: Cached = { mount, busy: 0 };
            this.host.set(id, entry);
            return entry;
          })
          .finally(() => this.opening.delete(id));
        this.opening.set(id, opening);
      }
      await opening;
    }
    clearTimeout(c.idle);
    c.busy++;
    const entry = c;
    let released = false;
    return {
      files: new HostFiles(c.mount.root, readOnly, this.o.defaults, this.o.maxListEntries),
      release: () => {
        if (released) return;
        released = true;
        entry.busy--;
        if (entry.busy === 0) {
          entry.idle = setTimeout(() => {
            if (this.host.get(id) === entry && entry.busy === 0) void this.releaseHost(id);
          }, this.o.hostIdleMs);
        }
      },
    };
  }

  /** Close the node's mount of volume `id` (and wait for a close already in flight). Never throws. */
  async releaseHost(id: string): Promise<void> {
    const c = this.host.get(id);
    if (!c) return this.closing.get(id);
    this.host.delete(id);
    clearTimeout(c.idle);
    const closed = c.mount.close().catch((e) => this.log.error({ volumeId: id, err: e }, "closing the node's mount of a volume failed"));
    this.closing.set(id, closed);
    await closed;
    if (this.closing.get(id) === closed) this.closing.delete(id);
  }

  guestFiles(t: GuestTarget, mountPath: string): GuestVolumeFiles {
    return new GuestVolumeFiles(envdUrl(t.endpoint.host), t.envdAccessToken, mountPath, this.o.defaults, this.o.maxListEntries, this.o.guestOpTimeoutMs);
  }

  async close(): Promise<void> {
    for (const id of [...this.host.keys()]) await this.releaseHost(id);
  }

  private hostOptions(id: string): HostVolumeOptions {
    return { id, paths: volumePaths(this.o.volumesDir, id), workDir: join(this.o.hostDir, id), disks: this.o.disks };
  }
}

/**
 * Serve each volume of a sandbox as a drive file (`<sandboxDir>/vol-<volumeId>/mnt/volume.img`),
 * read-only for read-only mounts. On failure the exports already made are closed.
 * @returns the exports and their drives (ids `vol0`, `vol1`, ... in mount order; serial = volume id)
 */
export async function serveVolumeDrives(
  sandboxId: string,
  sandboxDir: string,
  mounts: VolumeMount[],
  o: Pick<VmVolumesOptions, "volumesDir" | "disks">,
): Promise<{ disks: DiskExport[]; drives: DriveSpec[] }> {
  const disks: DiskExport[] = [];
  const drives: DriveSpec[] = [];
  try {
    for (const [i, m] of mounts.entries()) {
      const d = await o.disks.exportDisk({
        id: `${sandboxId}-vol-${m.volumeId}`,
        target: volumeTarget(volumePaths(o.volumesDir, m.volumeId), m.readOnly),
        mountPoint: join(sandboxDir, `vol-${m.volumeId}`, "mnt"),
        fileName: VOLUME_FILE,
      });
      disks.push(d);
      drives.push({ id: `vol${i}`, path: d.path, readOnly: m.readOnly, isRoot: false, serial: m.volumeId });
    }
  } catch (e) {
    for (const d of disks) await d.close().catch(() => {});
    throw e;
  }
  return { disks, drives };
}

/**
 * Shell function (POSIX sh: dash, busybox ash) setting `dev` to the name (vda...) of the block
 * device whose virtio serial is $1, or to "" when none has it. The serials are read with the
 * shell's own `read` (a serial without a final newline fails read but still sets the variable):
 * every program a guest script starts is an exec, which costs tens of ms in a TCG guest.
 */
export const FIND_DEV_SH = `
find_dev() {
  dev=
  for s in /sys/block/vd*/serial; do
    [ -r "$s" ] || continue
    x=
    read -r x < "$s" || :
    [ "$x" = "$1" ] && dev=\${s#/sys/block/} && dev=\${dev%/serial}
  done
}
`;

/**
 * The guest-side script that mounts one volume: find the block device whose virtio serial is the
 * volume id, make the mount point, mount ext4 (read-only: `ro,noload`, the journal is clean).
 * In a VM restored from a boot snapshot the drives were re-probed first (REPROBE_SCRIPT).
 * Arguments: $1 volume id, $2 mount path, $3 "ro" or "rw".
 */
export const MOUNT_SCRIPT = `${FIND_DEV_SH}
find_dev "$1"
[ -n "$dev" ] || { echo "no drive with serial $1" >&2; exit 2; }
dev=/dev/$dev
mkdir -p -- "$2"
if [ "$3" = ro ]; then mount -t ext4 -o ro,noload,nodev,nosuid "$dev" "$2"; else mount -t ext4 -o rw,nodev,nosuid "$dev" "$2"; fi
`;

/**
 * The guest-side script that re-probes volume drives, for a VM restored from a boot snapshot:
 * the kernel probed a placeholder in each volume drive's place, so the drive's size, read-only
 * flag and cached blocks are the placeholder's until a new probe reads the drive. For each
 * serial (the serial is read from the device each time, so it is the volume's already): unbind
 * and bind the virtio_blk driver of its device, then wait until its block device is back. The
 * probe is synchronous with the bind; the wait covers a slow one, up to 250 polls 20 ms apart
 * (each poll's usleep is an exec too: up to about 10 s in a TCG guest). Runs with the tools
 * drive's shell (busybox); needs /sys, and /.aenv/bin/usleep.
 * Arguments: the volume drives' serials. Exit 2: no drive has a serial; 3: a re-probe failed.
 */
export const REPROBE_SCRIPT = `${FIND_DEV_SH}
for id in "$@"; do
  find_dev "$id"
  [ -n "$dev" ] || { echo "no drive with serial $id" >&2; exit 2; }
  v=$(cd -P "/sys/block/$dev/device" && pwd) || { echo "no virtio device under /sys/block/$dev" >&2; exit 3; }
  v=\${v##*/}
  echo "$v" > /sys/bus/virtio/drivers/virtio_blk/unbind || { echo "cannot unbind $v ($dev)" >&2; exit 3; }
  echo "$v" > /sys/bus/virtio/drivers/virtio_blk/bind || { echo "cannot bind $v again" >&2; exit 3; }
done
for id in "$@"; do
  n=0
  find_dev "$id"
  until [ -n "$dev" ] && [ -b "/dev/$dev" ]; do
    n=$((n + 1))
    [ "$n" -gt 250 ] && { echo "drive with serial $id did not come back after its re-probe" >&2; exit 3; }
    /.aenv/bin/usleep 20000
    find_dev "$id"
  done
done
`;

/**
 * Mount each volume at its path in the guest (as root through envd); in a VM restored from a
 * boot snapshot, after its drives were re-probed (REPROBE_SCRIPT, restoreBootSnapshot).
 * @throws OrchestratorError `orchestrator.volume_mount_failed` naming the volume and mount's message
 */
export async function mountVolumesInGuest(base: string, token: string | null, mounts: VolumeMount[], timeoutMs: number): Promise<void> {
  for (const m of mounts) {
    const r = await execInGuest(base, token, "/bin/sh", ["-c", MOUNT_SCRIPT, "sh", m.volumeId, m.path, m.readOnly ? "ro" : "rw"], timeoutMs);
    if (r.exitCode !== 0) {
      throw new OrchestratorError("orchestrator.volume_mount_failed", `mounting volume ${m.name} at ${m.path} in the guest failed (exit ${r.exitCode}): ${r.stderr.trim()}`, {
        volumeId: m.volumeId,
        path: m.path,
      });
    }
  }
}

/**
 * Flush the guest's filesystems and unmount its volumes (`sync`, then `umount` each; a busy one
 * is synced and left mounted). Arguments: the mount paths.
 */
export const QUIESCE_SCRIPT = `
sync
rc=0
for p in "$@"; do umount -- "$p" 2>/dev/null || { sync -f -- "$p" 2>/dev/null; rc=3; }; done
exit $rc
`;
