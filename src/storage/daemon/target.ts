/**
 * Open the BlockImage a request's target names: a raw file, or an overlaybd stack (read-only
 * layers + an optional writable upper, created first when asked and missing).
 */
import { existsSync, mkdirSync } from "node:fs";
import { dirname } from "node:path";
import type { BlockImage } from "../block.ts";
import { createUpper, LayeredImage, openStack } from "../overlaybd/index.ts";
import type { DirectPlan } from "../fuse/index.ts";
import { layeredDirectPlan } from "./direct.ts";
import { DiskError } from "../errors.ts";
import type { TargetSpec } from "./protocol.ts";
import { RawFileImage } from "../raw.ts";

/**
 * Open `t`. For an overlaybd target with `create_upper_size`, the upper pair is created (with
 * that virtual size, 0 = the lowers' size) when its data file does not exist; an existing upper
 * keeps its writes (a resumed sandbox).
 * @throws DiskError `disk.open_failed` (missing layer or file), `disk.bad_spec`; OverlaybdError from the layers
 */
export async function openTarget(t: TargetSpec): Promise<BlockImage> {
  if (t.kind === "raw") return RawFileImage.open(t.path, { readOnly: t.read_only });
  for (const l of t.lowers) {
    if (!existsSync(l)) throw new DiskError("disk.open_failed", `layer ${l} does not exist`, { path: l });
  }
  if (t.upper && t.create_upper_size !== undefined && !existsSync(t.upper.data)) {
    mkdirSync(dirname(t.upper.data), { recursive: true });
    mkdirSync(dirname(t.upper.index), { recursive: true });
    await createUpper(t.upper, t.create_upper_size);
  }
  return openStack({ lowers: t.lowers, upper: t.upper, upperReadOnly: t.upper_read_only === true });
}

/** The direct-read plan of an opened image, when it has one beyond what the image offers itself. */
export function directPlanOf(img: BlockImage): DirectPlan | undefined {
  return img instanceof LayeredImage ? (layeredDirectPlan(img) ?? undefined) : undefined;
}
