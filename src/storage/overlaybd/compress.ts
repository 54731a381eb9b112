/**
 * Compress a committed layer file into ZFile form (overlaybd-commit -z / overlaybd-zfile),
 * optionally tar-wrapped. The input is checked to be a committed LSMT layer first.
 */
import { LocalFile } from "./backend.ts";
import { openRoLayer } from "./layer.ts";
import { writeZFile, type ZFileWriteOptions } from "./zfile.ts";
import { fail } from "./errors.ts";

/**
 * Write `src` (an uncompressed committed layer) as a ZFile at `outPath`.
 * @returns the output size in bytes
 * @throws OverlaybdError when `src` is not a plain LSMT layer (already compressed, wrong magic, ...)
 */
export async function compressLayer(src: string, outPath: string, opts: ZFileWriteOptions = {}): Promise<number> {
  const f = LocalFile.open(src);
  try {
    const layer = await openRoLayer(f);
    if (layer.wrapping.zfile || layer.wrapping.tar) fail("already_compressed", "layer is already ZFile-compressed or tar-wrapped", { file: src, offset: 0 });
    return await writeZFile(f, outPath, opts);
  } finally {
    await f.close();
  }
}
