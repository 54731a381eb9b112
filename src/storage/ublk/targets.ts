/**
 * What a ublk device serves: a `BlockImage` (the contract of src/storage/block.ts; FLUSH maps to
 * `sync`, DISCARD and WRITE_ZEROES to `discard`, which reads back as zeros) plus, where the bytes
 * live in local files, a direct plan the queue threads answer from without the main thread.
 * Targets: an overlaybd stack with a writable upper (sandbox disks), a read-only overlaybd stack
 * (shared memory images, one device mapped by many VMs), a raw file, and a raw file with chunked
 * copy-on-write over a read-only origin (cow.ts). Any other BlockImage can be served through
 * `imageTarget`.
 */
import type { BlockImage } from "../block.ts";
import { RawFileImage } from "../raw.ts";
import { LayeredImage, openImageConfig, openStack, type UpperPaths } from "../overlaybd/index.ts";
import { CowImage, type CowOptions } from "./cow.ts";
import { UblkError } from "./errors.ts";
import { rawPlan, stackPlan, type DirectPlan } from "./plan.ts";
import { errorCode, errorMessage } from "../../util/error.ts";
import { AgentEnvError } from "../../errors.ts";

/** A served image and how queue threads may serve it. */
export interface UblkTarget {
  /** Every request the queue threads cannot answer themselves goes here (on the main thread). */
  readonly image: BlockImage;
  /** What the queue threads serve directly; null: everything goes to `image`. */
  readonly plan: DirectPlan | null;
  /** Offer DISCARD / WRITE_ZEROES to the kernel (writable targets whose discard reads back zeros cheaply). */
  readonly discard: boolean;
  /** Short description for logs, e.g. `overlaybd 2 layers + upper`. */
  readonly describe: string;
}

function targetFailed(what: string, e: unknown): never {
  if (e instanceof UblkError) throw e;
  throw new UblkError("ublk.target_failed", `cannot open ${what}: ${errorMessage(e)}`, { cause: errorCode(e), ...(e instanceof AgentEnvError ? e.details : {}) }, { cause: e });
}

/** Wrap an open overlaybd image. */
export function layeredTarget(img: LayeredImage): UblkTarget {
  const n = img.lowers.length;
  return { image: img, plan: stackPlan(img), discard: !img.readOnly, describe: `overlaybd ${n} layer${n === 1 ? "" : "s"}${img.readOnly ? " (read-only)" : " + upper"}` };
}

/**
 * An overlaybd stack: read-only layers (bottom first) plus an optional writable upper; without
 * an upper the device is read-only (a shared memory image).
 * @throws UblkError `ublk.target_failed` (details from the OverlaybdError: file, offset)
 */
export async function openStackTarget(opts: { lowers: string[]; upper?: UpperPaths }): Promise<UblkTarget> {
  try {
    return layeredTarget(await openStack({ lowers: opts.lowers, upper: opts.upper }));
  } catch (e) {
    targetFailed(`overlaybd stack ${opts.lowers.join(",")}`, e);
  }
}

/**
 * An overlaybd stack from a `config.v1.json` (as `agentenv image stack` writes it); `readOnly`
 * drops the config's upper.
 * @throws UblkError `ublk.target_failed`
 */
export async function openConfigTarget(configPath: string, opts: { readOnly?: boolean } = {}): Promise<UblkTarget> {
  try {
    let img = await openImageConfig(configPath);
    if (opts.readOnly && !img.readOnly) {
      const lowers = [...img.lowers];
      // reopen the same lowers without the upper (the layers stay open; only the upper closes)
      await img.writable!.close();
      img = new LayeredImage(lowers, null);
    }
    return layeredTarget(img);
  } catch (e) {
    targetFailed(`overlaybd config ${configPath}`, e);
  }
}

/**
 * One raw file, served as is (read-only when asked).
 * @throws UblkError `ublk.target_failed`
 */
export function openRawTarget(path: string, opts: { readOnly: boolean }): UblkTarget {
  let img: RawFileImage;
  try {
    img = RawFileImage.open(path, { readOnly: opts.readOnly });
  } catch (e) {
    targetFailed(`raw file ${path}`, e);
  }
  return targetOf(img);
}

/**
 * A CoW file over a read-only origin (see cow.ts).
 * @throws UblkError `ublk.bad_config`, `ublk.target_failed`
 */
export function openCowTarget(opts: CowOptions): UblkTarget {
  const img = CowImage.open(opts);
  return { image: img, plan: img.plan(), discard: false, describe: `cow ${opts.cow} over ${opts.origin}` };
}

/**
 * The target of an image opened elsewhere (the disk daemon opens its own): an overlaybd stack or
 * a CoW image get their plans, an image offering its backing file (`directFile()`, a raw file)
 * the identity plan, anything else is served through the main thread.
 */
export function targetOf(image: BlockImage): UblkTarget {
  if (image instanceof LayeredImage) return layeredTarget(image);
  if (image instanceof CowImage) return { image, plan: image.plan(), discard: false, describe: "cow" };
  const file = (image as { directFile?: () => { fd: number; readOnly: boolean } | null }).directFile?.();
  if (file) {
    const name = (image as { path?: string }).path ?? `fd ${file.fd}`;
    const readOnly = file.readOnly || image.readOnly;
    return { image, plan: rawPlan({ fd: file.fd, name }, image.size, readOnly), discard: false, describe: `raw ${name}${readOnly ? " (read-only)" : ""}` };
  }
  return imageTarget(image);
}

/** Any BlockImage, served through the main thread (no direct plan unless given). */
export function imageTarget(image: BlockImage, plan: DirectPlan | null = null, describe = "image"): UblkTarget {
  return { image, plan, discard: !image.readOnly, describe };
}
