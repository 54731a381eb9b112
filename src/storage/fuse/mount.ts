/**
 * Mount a FUSE filesystem of our kind with mount(2) (no fusermount, no libfuse): open /dev/fuse,
 * mount with the fd in the mount data. Mount data per ../shared/docs/fuse-nbd.md §1.7.
 */
import { closeSync, mkdirSync, openSync, writeFileSync, constants as fsc } from "node:fs";
import { listMounts, MS_NODEV, MS_NOSUID, mount, MountError } from "../../ffi/mount.ts";
import { FuseError } from "./errors.ts";
import { errorMessage } from "../../util/error.ts";

const O_CLOEXEC = 0o2000000;
const O_NONBLOCK = 0o4000;

/** Default mount name; start-up reaping looks for `fuse.aenvdisk` mounts. */
export const FUSE_FS_NAME = "aenvdisk";

/**
 * Open /dev/fuse (non-blocking, close-on-exec) and mount a FUSE filesystem on `mountPoint`
 * (created if missing). The returned fd is the connection: whoever holds a copy of it keeps the
 * mount alive, so another process can hold one while the serving process comes and goes.
 * @param maxWrite bytes, the `max_read` mount option
 * @throws FuseError `fuse.open_device`, `fuse.mount` (details.errno)
 */
export function mountFuse(mountPoint: string, maxWrite: number, fsName = FUSE_FS_NAME): number {
  mkdirSync(mountPoint, { recursive: true });
  let fd: number;
  try {
    fd = openSync("/dev/fuse", fsc.O_RDWR | O_CLOEXEC | O_NONBLOCK);
  } catch (e) {
    throw new FuseError("fuse.open_device", `cannot open /dev/fuse: ${errorMessage(e)}`, {}, { cause: e });
  }
  const data = [
    `fd=${fd}`, "rootmode=40000", "user_id=0", "group_id=0", "allow_other", "default_permissions", `max_read=${maxWrite}`,
  ].join(",");
  try {
    mount(fsName, mountPoint, `fuse.${fsName}`, MS_NOSUID | MS_NODEV, data);
  } catch (e) {
    closeSync(fd);
    const errno = e instanceof MountError ? e.details.errno : undefined;
    throw new FuseError("fuse.mount", `cannot mount FUSE export on ${mountPoint}`, { mountPoint, errno }, { cause: e });
  }
  return fd;
}

/**
 * Set the readahead window of the FUSE mount at `mountPoint`: its backing device info's
 * read_ahead_kb (/sys/class/bdi/<major:minor>/, the device numbers from /proc/self/mountinfo).
 * The kernel starts a FUSE mount at min(128 KiB, INIT's max_readahead), so INIT cannot raise it;
 * call this once INIT is answered. The mount point is not stat'ed: that would ask the serving
 * thread (the caller) for the root's attributes. Page-cache readers (QEMU's default
 * cache=writeback) then read sequentially in READs of up to `kb` KiB instead of 128-256 KiB.
 * @returns null when set, else why not (no such mount, sysfs write refused)
 */
export function setReadAheadKb(mountPoint: string, kb: number): string | null {
  const m = listMounts().findLast((x) => x.mountPoint === mountPoint && x.fstype.startsWith("fuse"));
  if (!m) return `no FUSE mount at ${mountPoint}`;
  try {
    writeFileSync(`/sys/class/bdi/${m.dev}/read_ahead_kb`, `${kb}\n`);
    return null;
  } catch (e) {
    return `read_ahead_kb of bdi ${m.dev}: ${errorMessage(e)}`;
  }
}
