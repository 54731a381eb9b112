/**
 * Memory layers of a snapshot: the first one is the RAM image of a booted VM imported sparse
 * (zero pages not stored); later ones hold only the pages a restored VM changed, on top of the
 * image it was restored from (an all-zero changed page becomes a zeroed entry that hides the
 * page below).
 */
import { importChangedRanges, importSparse, openStack } from "../storage/overlaybd/index.ts";

/**
 * Where the guest RAM of a snapshot comes from (the shape of the VMM layer's `MemoryCapture`):
 * - `file`: the whole RAM as a file; `overParent` compares it with the parent image and keeps
 *   only differing blocks
 * - `changed`: page ranges changed since the parent image, and a reader of their bytes
 */
export type MemorySource =
  | { kind: "file"; path: string; overParent: boolean }
  | { kind: "changed"; ranges: ReadonlyArray<readonly [number, number]>; read(buf: Uint8Array, offset: number): void };

/**
 * Write the memory layer for `src` at `outPath` (a new file).
 * @param opts.size guest RAM size in bytes
 * @param opts.parentLayers layer files of the image the VM was restored from (bottom first),
 *   empty for a booted VM
 * @returns bytes of changed data the layer covers (the dirty amount; for a whole file, its data extents)
 * @throws OverlaybdError from writing the layer (nothing is left at `outPath`)
 */
export async function writeMemoryLayer(src: MemorySource, outPath: string, opts: { size: number; parentLayers: string[] }): Promise<{ changedBytes: number; layerBytes: number }> {
  if (src.kind === "changed") {
    const r = await importChangedRanges(src.read, src.ranges, outPath, { virtualSize: opts.size });
    return { changedBytes: src.ranges.reduce((a, [x, y]) => a + (y - x), 0), layerBytes: r.size };
  }
  if (src.overParent && opts.parentLayers.length > 0) {
    await using parent = await openStack({ lowers: opts.parentLayers });
    const r = await importSparse(src.path, outPath, { parent, meta: { virtualSize: opts.size } });
    return { changedBytes: r.segments.reduce((a, s) => a + s.length * 512, 0), layerBytes: r.size };
  }
  const r = await importSparse(src.path, outPath, { meta: { virtualSize: opts.size } });
  return { changedBytes: r.segments.reduce((a, s) => a + (s.zeroed ? 0 : s.length * 512), 0), layerBytes: r.size };
}
