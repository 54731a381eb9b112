/**
 * Garbage collection of template files over a real home directory: what a build boots from, a
 * build-base manifest and pinned layers (a paused sandbox of a deleted template) are never
 * removed; cache entries (steps, pulled images) are kept newest-used first within the byte
 * budget; older base layers, layers nothing names any more and old uploads go; young files stay.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { collectGarbage, TemplateCatalog } from "../../src/template/index.ts";

const MiB = 1048576;
let home: string;
const DAY = 86_400_000;
const now = Date.now();

/** A file of `mib` MiB of real (allocated) bytes, last modified `ageMs` ago. */
function file(rel: string, mib: number, ageMs: number, text?: string): string {
  const p = join(home, rel);
  mkdirSync(join(p, ".."), { recursive: true });
  writeFileSync(p, text ?? new Uint8Array(mib * MiB).fill(1));
  const t = new Date(now - ageMs);
  utimesSync(p, t, t);
  return p;
}

beforeAll(() => {
  home = mkdtempSync(join(tmpdir(), "aenv-gc-"));
});
afterAll(() => rmSync(home, { recursive: true, force: true }));

test("roots stay, the cache is trimmed newest-used first, unreferenced layers and old uploads go, young files stay", () => {
  // build-base template "base": its current layer, an older one (rebuilt since), a new one being written
  const baseNow = file("templates/base/rootfs-k-2.layer", 1, DAY);
  const baseOld = file("templates/base/rootfs-k-1.layer", 1, DAY);
  const baseYoung = file("templates/base/rootfs-k-3.layer", 1, 1000);
  file("templates/base/manifest.json", 0, DAY, JSON.stringify({ name: "base", rootfs: "rootfs.ext4", layers: ["rootfs-k-2.layer"], bootArgs: "", diskBytes: MiB, buildKey: "k", createdAt: new Date().toISOString() }));
  // a catalog template whose ready build boots from an image and a step layer
  const img = file("images/aaaa.layer", 1, DAY);
  file("images/aaaa.json", 0, DAY, "{}");
  const step1 = file("catalog/layers/s1.b1.layer", 1, DAY);
  const catalog = new TemplateCatalog(home);
  const { template, build } = catalog.requestBuild({ name: "app", cpuCount: 1, memoryMB: 256, diskSizeMB: 0 });
  catalog.setStatus(template.templateID, build.buildID, "ready", { boot: { layers: ["images/aaaa.layer", "catalog/layers/s1.b1.layer"], bootArgs: "", diskBytes: MiB, envs: {}, workdir: "/", user: "user", startCmd: "", readyCmd: "" } });
  // a paused sandbox's layers (its template was deleted): pinned by the caller
  const pinned = file("catalog/layers/p1.b2.layer", 1, DAY);
  // the step cache: three entries over base, used 3, 2 and 1 days ago, each with a 2 MiB layer of its own
  const c = [3, 2, 1].map((d, i) => {
    const layer = file(`catalog/layers/c${i}.b3.layer`, 2, d * DAY);
    file(`catalog/steps/c${i}.json`, 0, d * DAY, JSON.stringify({ layers: ["templates/base/rootfs-k-2.layer", `catalog/layers/c${i}.b3.layer`], context: {}, diskBytes: MiB }));
    return layer;
  });
  // an image nothing boots from, used 4 days ago
  const oldImg = file("images/bbbb.layer", 2, 4 * DAY);
  file("images/bbbb.json", 0, 4 * DAY, "{}");
  // a layer no record names at all (a removed template's), and uploads old and new
  const orphan = file("catalog/layers/o1.b4.layer", 1, DAY);
  const oldUpload = file(`catalog/files/${"a".repeat(64)}.tar`, 1, 2 * DAY);
  const newUpload = file(`catalog/files/${"b".repeat(64)}.tar`, 1, 1000);

  // room for two cache entries of 2 MiB (+ their records)
  const r = collectGarbage({ homePath: home, catalog, cacheMaxBytes: 4 * MiB + 64 * 1024, minAgeMs: 600_000, uploadMaxAgeMs: DAY, pinned: [pinned], now });
  for (const p of [baseNow, baseYoung, img, step1, pinned, c[1], c[2], newUpload]) expect([p, existsSync(p)]).toEqual([p, true]);
  for (const p of [baseOld, c[0], oldImg, orphan, oldUpload]) expect([p, existsSync(p)]).toEqual([p, false]);
  expect(existsSync(join(home, "catalog/steps/c0.json"))).toBe(false);
  expect(existsSync(join(home, "catalog/steps/c2.json"))).toBe(true);
  expect(existsSync(join(home, "images/bbbb.json"))).toBe(false);
  expect(existsSync(join(home, "images/aaaa.json"))).toBe(true); // its layer is a root: costs the cache nothing
  expect(r.removedLayers.sort()).toEqual([baseOld, c[0], oldImg, orphan].sort());
  expect(r.removedUploads).toEqual([oldUpload]);
  expect(r.removedCacheEntries).toBe(2);
  expect(r.freedBytes).toBeGreaterThanOrEqual(7 * MiB);
  expect(r.cacheBytes).toBeLessThanOrEqual(4 * MiB + 64 * 1024);

  // a second pass finds nothing more; a cache budget of 0 drops every entry but keeps every root
  expect(collectGarbage({ homePath: home, catalog, cacheMaxBytes: 4 * MiB + 64 * 1024, minAgeMs: 600_000, uploadMaxAgeMs: DAY, pinned: [pinned], now }).removedLayers).toEqual([]);
  const zero = collectGarbage({ homePath: home, catalog, cacheMaxBytes: 0, minAgeMs: 600_000, uploadMaxAgeMs: DAY, pinned: [pinned], now });
  expect(zero.removedLayers.sort()).toEqual([c[1], c[2]].sort());
  expect(existsSync(join(home, "images/aaaa.json"))).toBe(true); // its layer is booted from: the record stays
  for (const p of [baseNow, img, step1, pinned]) expect(existsSync(p)).toBe(true);
  // unpinned (the sandbox is gone): its layer goes
  expect(collectGarbage({ homePath: home, catalog, cacheMaxBytes: 0, minAgeMs: 600_000, uploadMaxAgeMs: DAY, pinned: [], now }).removedLayers).toEqual([pinned]);
});

test("build snapshots: the recorded ones a build names stay, the rest are released; never one this node did not record", () => {
  const h = mkdtempSync(join(tmpdir(), "aenv-gc-snap-"));
  try {
    const catalog = new TemplateCatalog(h);
    const boot = (snapshot?: string) => ({ layers: [], bootArgs: "", diskBytes: MiB, envs: {}, workdir: "/", user: "user", startCmd: "", readyCmd: "", ...(snapshot ? { snapshot } : {}) });
    const a = catalog.requestBuild({ name: "a", cpuCount: 1, memoryMB: 256, diskSizeMB: 0 });
    catalog.setStatus(a.template.templateID, a.build.buildID, "ready", { boot: boot("snapa1") });
    // a warm rebuild names the same snapshot; a failed build names none
    const a2 = catalog.requestBuild({ name: "a", cpuCount: 1, memoryMB: 256, diskSizeMB: 0 });
    catalog.setStatus(a.template.templateID, a2.build.buildID, "ready", { boot: boot("snapa1") });
    const b = catalog.requestBuild({ name: "b", cpuCount: 1, memoryMB: 256, diskSizeMB: 0 });
    catalog.setStatus(b.template.templateID, b.build.buildID, "ready", { boot: boot("snapb1") });
    const c = catalog.requestBuild({ name: "c", cpuCount: 1, memoryMB: 256, diskSizeMB: 0 });
    catalog.setStatus(c.template.templateID, c.build.buildID, "error", { reason: { message: "x" } });
    // recorded by this node's builds: both, plus one whose build record was lost (the node died
    // after the commit); "adopted" (another node's, found in a shared store) was never recorded
    mkdirSync(join(h, "catalog", "snapshots"), { recursive: true });
    for (const id of ["snapa1", "snapb1", "orphan"]) writeFileSync(join(h, "catalog", "snapshots", id), "");
    const released: string[] = [];
    const releaseSnapshot = (id: string) => void released.push(id);
    const gc = () => collectGarbage({ homePath: h, catalog, cacheMaxBytes: 0, minAgeMs: 0, uploadMaxAgeMs: DAY, pinned: [], releaseSnapshot, now: Date.now() }).releasedSnapshots;
    expect(gc()).toEqual(["orphan"]);
    expect(gc()).toEqual([]);
    catalog.remove(a.template.templateID);
    expect(gc()).toEqual(["snapa1"]);
    expect(released).toEqual(["orphan", "snapa1"]);
    expect(readdirSync(join(h, "catalog", "snapshots"))).toEqual(["snapb1"]);
    // without a release function (a runtime without a repository) nothing is released
    catalog.remove(b.template.templateID);
    expect(collectGarbage({ homePath: h, catalog, cacheMaxBytes: 0, minAgeMs: 0, uploadMaxAgeMs: DAY, pinned: [], now: Date.now() }).releasedSnapshots).toEqual([]);
    expect(gc()).toEqual(["snapb1"]);
  } finally {
    rmSync(h, { recursive: true, force: true });
  }
});
