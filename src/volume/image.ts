/**
 * A volume's disk: an ext4 filesystem inside an overlaybd image, in `<volumesDir>/<id>/`:
 * `base.layer` (the freshly made, empty filesystem as a committed layer; zero blocks not stored)
 * and `upper/upper.data` + `upper/upper.index` (everything written since). It is served to a VM
 * or to the host like a sandbox's root disk (src/storage/daemon), writable by one at a time or
 * read-only by many (`readOnly` spec: the upper is opened O_RDONLY).
 */
import { mkdirSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { TargetSpec } from "../storage/daemon/index.ts";
import { createUpper, importSparse } from "../storage/overlaybd/index.ts";
import { VolumeError } from "./errors.ts";
import { errorMessage } from "../util/error.ts";

/** Files of one volume. */
export interface VolumePaths {
  dir: string;
  base: string;
  upper: { data: string; index: string };
}

/** Where volume `id` lives under `volumesDir`. */
export function volumePaths(volumesDir: string, id: string): VolumePaths {
  const dir = join(volumesDir, id);
  return { dir, base: join(dir, "base.layer"), upper: { data: join(dir, "upper", "upper.data"), index: join(dir, "upper", "upper.index") } };
}

/** What the disk daemon serves for volume files `p` (read-only: the upper is opened O_RDONLY). */
export function volumeTarget(p: VolumePaths, readOnly: boolean): TargetSpec {
  return { kind: "overlaybd", lowers: [p.base], upper: p.upper, ...(readOnly ? { upper_read_only: true } : {}) };
}

/**
 * Make the disk of a new volume: `mkfs.ext4` (label `label`, root directory owned by
 * `owner.uid:owner.gid`, no reserved blocks, inode tables and journal written now so no guest
 * initialises them later) on a sparse file of `sizeBytes`, imported as `base.layer`, plus an
 * empty upper. Removes everything it made when it fails.
 * @throws VolumeError `volume.image_failed` naming the step (mkfs output included)
 */
export async function createVolumeImage(p: VolumePaths, sizeBytes: number, owner: { uid: number; gid: number }, label: string): Promise<void> {
  if (!Number.isSafeInteger(sizeBytes) || sizeBytes < 16 << 20 || sizeBytes % 4096 !== 0) {
    throw new VolumeError("volume.image_failed", `volume size ${sizeBytes} must be a multiple of 4096 of at least 16 MiB`, { sizeBytes });
  }
  mkdirSync(join(p.dir, "upper"), { recursive: true });
  const raw = join(p.dir, "mkfs.raw");
  try {
    writeFileSync(raw, "");
    truncateSync(raw, sizeBytes);
    const mkfs = Bun.spawnSync(
      ["mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-L", label.slice(0, 16), "-E", `root_owner=${owner.uid}:${owner.gid},lazy_itable_init=0,lazy_journal_init=0`, raw],
      { stdout: "pipe", stderr: "pipe" },
    );
    if (mkfs.exitCode !== 0) {
      throw new VolumeError("volume.image_failed", `mkfs.ext4 failed (exit ${mkfs.exitCode}): ${mkfs.stderr.toString().trim()}`, { dir: p.dir, step: "mkfs" });
    }
    await importSparse(raw, p.base);
    await createUpper(p.upper, sizeBytes);
  } catch (e) {
    rmSync(p.dir, { recursive: true, force: true });
    if (e instanceof VolumeError) throw e;
    throw new VolumeError("volume.image_failed", `making the volume disk in ${p.dir} failed: ${errorMessage(e)}`, { dir: p.dir }, { cause: e });
  } finally {
    rmSync(raw, { force: true });
  }
}
