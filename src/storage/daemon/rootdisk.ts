/**
 * A sandbox's root disk: the template's overlaybd layers (shared, read-only) plus a writable
 * upper of its own, served as `<sandboxDir>/mnt/root.img` for the VMM.
 */
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { createUpper } from "../overlaybd/index.ts";
import type { DiskConfig } from "./config.ts";
import { DiskError } from "./errors.ts";
import { type DiskShutdown, exportDisk, type ExportedDisk } from "./export.ts";

/** Name of the served root disk file inside `<sandboxDir>/mnt/`. */
export const ROOT_DISK_FILE = "root.img";

/** Inputs of `prepareRootDisk`. */
export interface RootDiskOptions {
  /** Sandbox id (names the serving child's record). */
  id: string;
  /** Template layer files, bottom first (absolute paths; never written). */
  lowers: string[];
  /** The sandbox's own directory: upper files go to `upper/`, the mount to `mnt/`. */
  sandboxDir: string;
  /** Virtual disk size in bytes (multiple of 512); 0 = the template's size. */
  virtualSize?: number;
  /** `<runtime_path>/disks`: records for crash reaping. */
  recordDir: string;
  config: DiskConfig;
  /** The owner's shutdown switch (see DiskShutdown). */
  shutdown?: DiskShutdown;
}

/** Paths of a sandbox's writable upper layer. */
export function upperPaths(sandboxDir: string): { data: string; index: string } {
  return { data: join(sandboxDir, "upper", "upper.data"), index: join(sandboxDir, "upper", "upper.index") };
}

/**
 * Create the sandbox's upper layer if it does not exist yet (a restarted sandbox keeps its
 * writes), then serve lowers + upper as `<sandboxDir>/mnt/root.img`.
 * @returns the export; `close()` stops serving (the upper files stay for the caller to keep or
 *   delete). Stop the VMM first, and close before removing `sandboxDir`: a recursive delete would
 *   otherwise walk into the live mount.
 * @throws DiskError `disk.bad_spec` (no lowers, relative paths, bad size), `disk.serve_failed`;
 *   OverlaybdError from creating the upper
 */
export async function prepareRootDisk(opts: RootDiskOptions): Promise<ExportedDisk> {
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
  const upper = upperPaths(opts.sandboxDir);
  if (!existsSync(upper.data)) {
    mkdirSync(join(opts.sandboxDir, "upper"), { recursive: true });
    await createUpper(upper, size);
  }
  return exportDisk({
    id: opts.id,
    image: { kind: "overlaybd", lowers: opts.lowers, upper },
    workDir: opts.sandboxDir,
    recordDir: opts.recordDir,
    fileName: ROOT_DISK_FILE,
    config: opts.config,
    shutdown: opts.shutdown,
  });
}
