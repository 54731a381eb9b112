/**
 * Garbage collection of template files: overlaybd layers (per-step layers in
 * `$home/catalog/layers/`, pulled images in `$home/images/`, older `build-base` layers in
 * `$home/templates/<name>/`), the step cache that names them (`$home/catalog/steps/`) and
 * uploaded COPY archives (`$home/catalog/files/`).
 *
 * Never removed: a layer a build of a catalog template boots from, a `build-base` manifest's
 * layers, and what the caller pins (the layers running and paused sandboxes stack on, the ones
 * snapshots hold). The rest is cache, kept newest-used first (a cache hit touches its entry)
 * up to `cacheMaxBytes` of layers it alone keeps alive; older entries are dropped and every layer
 * then unreferenced is deleted. A snapshot a build committed (recorded in
 * `$home/catalog/snapshots/`) lives as long as a build names it (a cached finalize naming a
 * released one runs again). Files younger than `minAgeMs` are left alone (one being written
 * or not yet named by its record). Uploads go after `uploadMaxAgeMs` (the SDK uploads again
 * when a build needs them). The caller runs it when no build is running or queued.
 */
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { isAbsolute, join } from "node:path";
import { imageRecordLayer } from "../image/index.ts";
import type { TemplateCatalog } from "./catalog.ts";
import { STEP_LAYERS } from "./records.ts";
import { listTemplates as listManifests, templateDir } from "./store.ts";

/** Bounds of a collection. */
export interface GcOptions {
  homePath: string;
  catalog: TemplateCatalog;
  /** Bytes of layers kept only by the cache (step entries, pulled images). */
  cacheMaxBytes: number;
  /** Files younger than this are never removed, ms. */
  minAgeMs: number;
  /** Uploaded archives older than this are removed, ms. */
  uploadMaxAgeMs: number;
  /** Absolute paths of layers that something else stacks on (sandboxes, snapshots). */
  pinned: Iterable<string>;
  /**
   * Releases a snapshot a build committed (BuildVmLauncher.releaseSnapshot). The ones recorded in
   * `$home/catalog/snapshots/` that no build names are released; absent: none are.
   */
  releaseSnapshot?: (id: string) => void;
  now?: number;
}

/** What a collection removed and kept. */
export interface GcReport {
  /** Absolute paths of deleted layer files. */
  removedLayers: string[];
  /** Step cache entries and image cache records dropped. */
  removedCacheEntries: number;
  /** Absolute paths of deleted uploads. */
  removedUploads: string[];
  /** Bytes freed on disk (allocated blocks). */
  freedBytes: number;
  /** Bytes of layers the cache keeps. */
  cacheBytes: number;
  /** Ids of build snapshots released (no build named them). */
  releasedSnapshots: string[];
}

interface CacheEntry {
  /** Files making up the entry (its record, and an image's own layer). */
  files: string[];
  /** Layers it keeps alive. */
  layers: string[];
  usedAt: number;
}

const diskBytes = (p: string) => {
  try {
    return statSync(p).blocks * 512;
  } catch {
    return 0;
  }
};
const mtime = (p: string) => {
  try {
    return statSync(p).mtimeMs;
  } catch {
    return 0;
  }
};

/** Collect (see the module doc). Never throws for a file that vanished meanwhile. */
export function collectGarbage(o: GcOptions): GcReport {
  const now = o.now ?? Date.now();
  const home = o.homePath;
  const abs = (l: string) => (isAbsolute(l) ? l : join(home, l));
  const report: GcReport = { removedLayers: [], removedCacheEntries: 0, removedUploads: [], freedBytes: 0, cacheBytes: 0, releasedSnapshots: [] };
  const young = (p: string) => now - mtime(p) < o.minAgeMs;

  // roots: what builds boot from, build-base manifests, and the caller's pins
  const keep = new Set<string>([...o.pinned].map(abs));
  for (const t of o.catalog.list()) for (const b of t.builds) for (const l of b.boot?.layers ?? []) keep.add(abs(l));
  for (const m of listManifests(home)) for (const l of m.layers) keep.add(join(templateDir(home, m.name), l));

  // the cache: step entries and pulled images, newest use first
  const entries: CacheEntry[] = [];
  const stepDir = join(home, "catalog", "steps");
  for (const f of existsSync(stepDir) ? readdirSync(stepDir) : []) {
    if (!f.endsWith(".json")) continue;
    const p = join(stepDir, f);
    let layers: string[] = [];
    try {
      const r = STEP_LAYERS.parse(readFileSync(p, "utf8"));
      if (r.ok) layers = (r.value.layers ?? []).map(abs);
    } catch {
      // unreadable: an entry without layers, dropped with the rest when over budget
    }
    entries.push({ files: [p], layers, usedAt: mtime(p) });
  }
  const imageDir = join(home, "images");
  for (const f of existsSync(imageDir) ? readdirSync(imageDir) : []) {
    if (!f.endsWith(".json")) continue;
    const rec = join(imageDir, f);
    const layer = imageRecordLayer(rec);
    entries.push({ files: [rec], layers: layer ? [layer] : [], usedAt: mtime(rec) });
  }
  entries.sort((a, b) => b.usedAt - a.usedAt);
  const cached = new Set<string>();
  for (const e of entries) {
    const extra = e.layers.filter((l) => !keep.has(l) && !cached.has(l));
    // the records count too: entries without layers (passed ready checks) are not free forever
    const bytes = [...extra, ...e.files].reduce((a, l) => a + diskBytes(l), 0);
    // an entry whose layers something boots from stays (a dropped image record would make the
    // next pull convert again beside the layer in use)
    const rooted = e.layers.length > 0 && e.layers.every((l) => keep.has(l));
    const fits = rooted || report.cacheBytes + bytes <= o.cacheMaxBytes || e.files.every(young);
    if (fits) {
      report.cacheBytes += bytes;
      for (const l of e.layers) cached.add(l);
      continue;
    }
    for (const f of e.files) rmSync(f, { force: true });
    report.removedCacheEntries++;
  }

  // layers no root and no kept cache entry names
  const candidates = [
    ...[join(home, "catalog", "layers"), imageDir].flatMap((d) => (existsSync(d) ? readdirSync(d).filter((f) => f.endsWith(".layer")).map((f) => join(d, f)) : [])),
    ...listManifests(home).flatMap((m) => {
      const d = templateDir(home, m.name);
      return readdirSync(d).filter((f) => f.endsWith(".layer")).map((f) => join(d, f));
    }),
  ];
  for (const l of candidates) {
    if (keep.has(l) || cached.has(l) || young(l)) continue;
    report.freedBytes += diskBytes(l);
    rmSync(l, { force: true });
    report.removedLayers.push(l);
  }

  const files = join(home, "catalog", "files");
  for (const f of existsSync(files) ? readdirSync(files) : []) {
    const p = join(files, f);
    if (!f.endsWith(".tar") || now - mtime(p) < o.uploadMaxAgeMs) continue;
    report.freedBytes += diskBytes(p);
    rmSync(p, { force: true });
    report.removedUploads.push(p);
  }

  // only snapshots this node's builds committed (recorded before publishing): never one another
  // node committed and this one adopted from a shared store
  const ledger = join(home, "catalog", "snapshots");
  if (o.releaseSnapshot && existsSync(ledger)) {
    const named = new Set(o.catalog.list().flatMap((t) => t.builds.flatMap((b) => (b.boot?.snapshot ? [b.boot.snapshot] : []))));
    for (const id of readdirSync(ledger).sort()) {
      if (named.has(id) || young(join(ledger, id))) continue;
      o.releaseSnapshot(id);
      rmSync(join(ledger, id), { force: true });
      report.releasedSnapshots.push(id);
    }
  }
  return report;
}
