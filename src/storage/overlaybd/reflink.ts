/**
 * Snapshot copies of live files: FICLONE (reflink) where the filesystem shares extents (XFS,
 * btrfs), else a plain copy.
 */
import { copyFileSync, rmSync } from "node:fs";
import { LocalFile } from "./backend.ts";
import { ficlone } from "../../ffi/file_extents.ts";
import { logger } from "../../observability/log.ts";

const log = logger("overlaybd");

/** Reflink `src` into a new file `dst` (FICLONE); on EOPNOTSUPP/EXDEV/EINVAL copy instead. */
export function reflinkOrCopy(src: LocalFile, dst: string): "reflink" | "copy" {
  const out = LocalFile.open(dst, { writable: true, create: true });
  let err: number;
  try {
    err = ficlone(out.fd, src.fd);
    if (err === 0) return "reflink";
  } finally {
    out.closeSync();
  }
  log.debug({ file: src.name, errno: err }, "FICLONE unsupported, copying");
  rmSync(dst, { force: true });
  copyFileSync(src.name, dst);
  return "copy";
}
