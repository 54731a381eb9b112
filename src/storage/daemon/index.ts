/**
 * The disk service: one long-lived daemon per node (`agentenv ublk-daemon`, ./daemon.ts) owns
 * every export of the node (FUSE files, ./fuse-engine.ts; /dev/ublkbN devices where the kernel
 * has ublk, ./ublk-engine.ts; both behind ./engine.ts), speaks a length-prefixed JSON protocol on a Unix socket (./protocol.ts), keeps its
 * devices in SQLite (./store.ts) and serves them again after a crash.
 *
 * Node side (`DiskService`, ./service.ts):
 * - `DiskService.start({ dir: <runtime_path>/disk, config: diskConfig(cfg) })` (shuts down a
 *   daemon a crashed node left: it removes every device it had); with `mode: "adopt"` such a
 *   daemon is kept (same protocol version): `svc.claim(devId)` → `{kind: "claimed", disk}` |
 *   `{kind: "lost", reason}` | `{kind: "missing"}` for each export a sandbox still uses, then
 *   `svc.reapUnclaimed()`; `svc.detach()` leaves the daemon and its devices to the next node
 * - `svc.rootDisk({ id, lowers, sandboxDir, virtualSize })` → `DiskExport` `{ path, close() }`:
 *   template layers + the sandbox's upper, served as `<sandboxDir>/mnt/root.img`
 * - `svc.exportDisk({ id, target, mountPoint?, fileName? })` → a raw file or a stack
 * - `svc.acquireShared({ key, lowers | rawPath, acceptWritableOpen })` → one refcounted
 *   read-only device per key (a snapshot's memory image); `svc.stats(id)` counts its reads
 * - `svc.restack(id, layerPath | null, nextUpper)`, `svc.list()`, `svc.features()`
 * - `svc.beginShutdown()` first in the node's shutdown, `svc.close()` last
 * - `reapStaleMounts(roots)` at node start for mounts no daemon owns
 */
export { daemonSettings, diskConfig, type DiskConfig } from "./config.ts";
export { DiskError } from "../errors.ts";
export { RawFileImage } from "../raw.ts";
export { reapStaleMounts } from "./reap.ts";
export { agentenvCommand, DiskService, ROOT_DISK_FILE, sharedDeviceId, upperPaths, type DiskClaim, type DiskExport, type DiskStartMode, type RootDiskOptions } from "./service.ts";
export { DISK_PROTOCOL_VERSION } from "./protocol.ts";
export type { DeviceInfo, DeviceStats, EngineName, TargetSpec } from "./protocol.ts";
