/**
 * The disk service: serves sandbox disks to VMMs as plain files on FUSE mounts, one serving
 * child process per disk (see ./serve.ts for why), and reaps what a crashed node left.
 *
 * - `exportDisk({ id, image, workDir, recordDir, config })` → `{ path, pid, exited, close() }`
 * - `prepareRootDisk({ id, lowers, sandboxDir, virtualSize, recordDir, config })` → the same, for
 *   a template's overlaybd layers + a fresh upper in the sandbox dir, served as `mnt/root.img`
 * - `reapStaleDisks(recordDir, { mountRoots })` at node start
 * - `DiskShutdown.begin()` (the switch passed to its exports) first thing in a node's shutdown: its child exits are then expected
 *
 * Serving children run in their own session, so Ctrl-C on the node's terminal does not kill them.
 */
export { diskConfig, type DiskConfig } from "./config.ts";
export { DiskError } from "./errors.ts";
export { agentenvCommand, DiskShutdown, exportDisk, type ExportedDisk } from "./export.ts";
export { RawFileImage } from "./raw.ts";
export { prepareRootDisk, ROOT_DISK_FILE, upperPaths, type RootDiskOptions } from "./rootdisk.ts";
export { reapStaleDisks, type ReapReport } from "./reap.ts";
export type { DiskImageSpec, FuseTuning, ServeSpec } from "./spec.ts";
