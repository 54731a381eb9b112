/**
 * overlaybd's image config (`config.v1.json`, overlaybd-format.md 4; overlaybd src/config.h,
 * src/image_file.cpp): `lowers` bottom first, each resolved to a local file (`file`, then
 * `dir/overlaybd.commit`, `dir/.commit`, `dir/overlaybd.sealed`) or a remote registry blob;
 * optional writable `upper`; `resultFile` receives `success` or `failed:<reason>`.
 */
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, isAbsolute, join } from "node:path";
import type { Backend } from "./backend.ts";
import { fail, OverlaybdError } from "./errors.ts";
import { openRoLayer, openRoLayerFile, type RoLayer } from "./layer.ts";
import { LayeredImage, openStack } from "./stack.ts";
import { errorMessage } from "../../util/error.ts";

/** One lower entry as written by the snapshotter. */
export interface ConfigLower {
  file?: string;
  dir?: string;
  digest?: string;
  size?: number;
}

/** The parts of config.v1.json this implementation reads. */
export interface ImageConfig {
  repoBlobUrl?: string;
  lowers: ConfigLower[];
  upper?: { index: string; data: string };
  resultFile?: string;
}

/** Opens a remote blob; supplied by the caller (see registry.ts) so this module stays local. */
export type RemoteOpener = (url: string, size: number | undefined) => Promise<Backend>;

/**
 * Parse and check a config document.
 * @throws OverlaybdError `bad_config` naming the file and the field
 */
export function parseImageConfig(text: string, file: string): ImageConfig {
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch (e) {
    fail("bad_config", `image config is not JSON: ${errorMessage(e)}`, { file });
  }
  const o = j as Record<string, unknown>;
  if (typeof o !== "object" || o === null || !Array.isArray(o.lowers)) fail("bad_config", "image config needs a `lowers` array", { file, field: "lowers" });
  o.lowers.forEach((l, i) => {
    if (typeof l !== "object" || l === null) fail("bad_config", `lowers[${i}] is not an object`, { file, field: `lowers[${i}]` });
    const x = l as Record<string, unknown>;
    for (const k of ["file", "dir", "digest"]) if (x[k] !== undefined && typeof x[k] !== "string") fail("bad_config", `lowers[${i}].${k} must be a string`, { file, field: `lowers[${i}].${k}` });
    if (x.size !== undefined && typeof x.size !== "number") fail("bad_config", `lowers[${i}].size must be a number`, { file, field: `lowers[${i}].size` });
    if (!x.file && !x.dir && !x.digest) fail("bad_config", `lowers[${i}] names no file, dir or digest`, { file, field: `lowers[${i}]` });
  });
  if (o.upper !== undefined) {
    const u = o.upper as Record<string, unknown>;
    if (typeof u !== "object" || u === null || typeof u.index !== "string" || typeof u.data !== "string") fail("bad_config", "upper needs string `index` and `data`", { file, field: "upper" });
  }
  if (o.repoBlobUrl !== undefined && typeof o.repoBlobUrl !== "string") fail("bad_config", "repoBlobUrl must be a string", { file, field: "repoBlobUrl" });
  if (o.resultFile !== undefined && typeof o.resultFile !== "string") fail("bad_config", "resultFile must be a string", { file, field: "resultFile" });
  return o as unknown as ImageConfig;
}

/** Where a lower entry resolves to: a local path or a remote URL. */
export function resolveLower(l: ConfigLower, repoBlobUrl: string | undefined, base: string): { path: string } | { url: string; size?: number } {
  const abs = (p: string) => (isAbsolute(p) ? p : join(base, p));
  if (l.file && existsSync(abs(l.file))) return { path: abs(l.file) };
  if (l.dir) for (const n of ["overlaybd.commit", ".commit", "overlaybd.sealed"]) if (existsSync(join(abs(l.dir), n))) return { path: join(abs(l.dir), n) };
  if (l.digest && repoBlobUrl) return { url: `${repoBlobUrl.replace(/\/$/, "")}/${l.digest}`, size: l.size };
  if (l.file) fail("open_failed", `lower file ${abs(l.file)} does not exist`, { file: abs(l.file) });
  fail("bad_config", `lower ${JSON.stringify(l)} resolves to nothing local and has no digest + repoBlobUrl`, { lower: l });
}

/**
 * Open the image a config file describes. Relative paths resolve against the config's folder.
 * Writes `success` / `failed:<reason>` to `resultFile` when set.
 * @throws OverlaybdError from parsing or from any layer
 */
export async function openImageConfig(path: string, opts: { remote?: RemoteOpener } = {}): Promise<LayeredImage> {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    fail("open_failed", `cannot read image config: ${errorMessage(e)}`, { file: path });
  }
  const cfg = parseImageConfig(text, path);
  const base = dirname(path);
  try {
    const lowers: RoLayer[] = [];
    for (const l of cfg.lowers) {
      const r = resolveLower(l, cfg.repoBlobUrl, base);
      if ("path" in r) lowers.push(await openRoLayerFile(r.path));
      else {
        if (!opts.remote) fail("no_remote", `lower ${r.url} is remote but no registry backend was given`, { file: path, url: r.url });
        lowers.push(await openRoLayer(await opts.remote(r.url, r.size)));
      }
    }
    const abs = (p: string) => (isAbsolute(p) ? p : join(base, p));
    const img = await openStack({ lowers, upper: cfg.upper ? { data: abs(cfg.upper.data), index: abs(cfg.upper.index) } : undefined });
    if (cfg.resultFile) writeFileSync(abs(cfg.resultFile), "success");
    return img;
  } catch (e) {
    if (cfg.resultFile) {
      const why = e instanceof OverlaybdError ? e.message : String(e);
      try {
        writeFileSync(isAbsolute(cfg.resultFile) ? cfg.resultFile : join(base, cfg.resultFile), `failed:${why}`);
      } catch {
        // the original error matters more than the result file
      }
    }
    throw e;
  }
}
