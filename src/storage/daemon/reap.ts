/**
 * Start-up clean-up the daemon cannot do itself: FUSE mounts of ours under the node's
 * directories that no live daemon device owns (e.g. left by a version that served disks from
 * one child process per disk, or by a daemon whose database was lost).
 */
import { listMounts, MNT_DETACH, umount2 } from "../../ffi/mount.ts";
import { logger } from "../../observability/log.ts";
import { FUSE_FS_NAME } from "../fuse/index.ts";

const log = logger("disk");

/**
 * Detach every `fuse.aenvdisk` mount under one of `roots` (absolute directory prefixes) except
 * the mount points in `keep`.
 * @returns the mount points detached
 */
export function reapStaleMounts(roots: string[], keep: ReadonlySet<string> = new Set()): string[] {
  const prefixes = roots.map((r) => r.replace(/\/+$/, "") + "/");
  const out: string[] = [];
  for (const m of listMounts()) {
    if (m.fstype !== `fuse.${FUSE_FS_NAME}` || keep.has(m.mountPoint)) continue;
    if (!prefixes.some((p) => m.mountPoint.startsWith(p))) continue;
    if (umount2(m.mountPoint, MNT_DETACH) === 0) out.push(m.mountPoint);
  }
  if (out.length) log.info({ unmounted: out }, "detached stale disk mounts");
  return out;
}
