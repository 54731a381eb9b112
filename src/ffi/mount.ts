/**
 * mount(2) and umount2(2) from glibc through bun:ffi. Used to mount our FUSE exports without
 * libfuse or fusermount (we run as root, so the raw syscall suffices).
 * Source of the constants: include/uapi/linux/mount.h and sys/mount.h (x86_64).
 */
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc } from "./libc.ts";

/** Thrown when a mount-related syscall fails; `details.errno` holds the raw errno. */
export class MountError extends AgentEnvError<FfiCodes<"mount">> {}

/** mount flags (include/uapi/linux/mount.h). */
export const MS_NOSUID = 0x2;
export const MS_NODEV = 0x4;
/** umount2 flags (sys/mount.h). */
export const MNT_FORCE = 0x1;
export const MNT_DETACH = 0x2;

/** errno values we branch on (asm-generic/errno-base.h). */
export const ERRNO = { EPERM: 1, ENOENT: 2, EINTR: 4, EIO: 5, EAGAIN: 11, EBUSY: 16, ENODEV: 19, EINVAL: 22 } as const;

function cstr(s: string): Buffer {
  if (s.includes("\0")) throw new MountError("mount.bad_argument", "argument contains a NUL byte", { value: s });
  return Buffer.from(s + "\0", "utf8");
}


/**
 * mount(2).
 * @param source free text shown in /proc/mounts (e.g. "aenvdisk")
 * @param target existing directory
 * @param fstype e.g. "fuse.aenvdisk"
 * @param flags MS_* bits
 * @param data filesystem options string (for FUSE: "fd=N,rootmode=40000,user_id=0,group_id=0,...")
 * @throws MountError `mount.failed` with `errno`, target, fstype
 */
export function mount(source: string, target: string, fstype: string, flags: number, data: string): void {
  const s = cstr(source), t = cstr(target), f = cstr(fstype), d = cstr(data);
  const rc = libc().mount(s, t, f, BigInt(flags), d);
  if (rc !== 0) {
    const e = errno();
    throw new MountError("mount.failed", `mount ${fstype} on ${target} failed: errno ${e}`, { errno: e, target, fstype, source });
  }
}

/**
 * umount2(2).
 * @param flags MNT_DETACH (lazy) and/or MNT_FORCE
 * @returns 0 on success, else the errno (EINVAL: not a mount point, ENOENT: no such path)
 */
export function umount2(target: string, flags: number): number {
  const rc = libc().umount2(cstr(target), flags);
  return rc === 0 ? 0 : errno();
}

/** One line of /proc/self/mountinfo reduced to what reaping needs. */
export interface MountInfo {
  mountPoint: string;
  fstype: string;
  source: string;
  /** st_dev of the mount, "major:minor" (FUSE: minor names /sys/fs/fuse/connections/<minor>). */
  dev: string;
}

/** Octal escapes (\040 for space, ...) as written by the kernel in mountinfo. */
function unescape(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/**
 * Parse /proc/self/mountinfo (format: proc(5)). Returns every mount of this mount namespace.
 */
export function listMounts(text?: string): MountInfo[] {
  const src = text ?? require("node:fs").readFileSync("/proc/self/mountinfo", "utf8");
  const out: MountInfo[] = [];
  for (const line of src.split("\n")) {
    if (!line) continue;
    const sep = line.indexOf(" - ");
    if (sep < 0) continue;
    const left = line.slice(0, sep).split(" ");
    const right = line.slice(sep + 3).split(" ");
    out.push({ dev: left[2]!, mountPoint: unescape(left[4]!), fstype: right[0]!, source: unescape(right[1]!) });
  }
  return out;
}

/** mount flag of a bind mount (include/uapi/linux/mount.h). */
export const MS_BIND = 0x1000;

/**
 * Make the mount at `source` (a directory) visible at `target` too: mount(2) with MS_BIND.
 * @throws MountError `mount.failed` with `errno`
 */
export function bindMount(source: string, target: string): void {
  mount(source, target, "none", MS_BIND, "");
}
