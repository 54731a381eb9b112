#!/usr/bin/env bun
/**
 * Template build benchmark. (1) Pull of a Debian image (one zstd layer packed from the test
 * home's Debian tree) from Debian's docker-registry on 127.0.0.1: skopeo fetch time and MB/s of
 * compressed bytes, against a plain HTTP GET of the same blob from the same registry
 * (baseline), then the full pull (fetch + umoci unpack + mkfs + overlaybd import). (2) On a real
 * node (`agentenv server` in a namespace, QEMU TCG build VMs) with the unmodified e2b SDK: a cold
 * build (pull + 4 steps + ready check + snapshot commit), a warm rebuild (every step cached), and
 * the create time of a sandbox from the built template (a restore of its snapshot, the start
 * command answering) against `base` (baseline, also a restore),
 * medians of N. Needs root, the kernel and base template in AENV_TEST_HOME_PATH.
 *   bun bench/template.ts [--runs 3]
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { plainRegistrySettings, pullImage } from "../src/image/index.ts";
import { debianTree, pushImage, startRegistry } from "../test/image/registry.ts";
import { NodeWorld, TEST_HOME } from "../test/e2e/world.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const RUNS = arg("--runs", 3);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const s = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
const load0 = loadavg()[0]!;
const tree = debianTree(TEST_HOME);

// (1) pull on the host
{
  const reg = await startRegistry();
  const home = mkdtempSync(join(tmpdir(), "aenv-tplbench-"));
  try {
    const img = await pushImage(reg.host, "bench/deb:v1", [{ dir: tree.dir, paths: tree.paths, compression: "zstd" }]);
    const layer = JSON.parse(await Bun.file(join(img.dir, "manifest.json")).text()).layers[0] as { digest: string; size: number };
    rmSync(img.dir, { recursive: true, force: true });
    const t0 = performance.now();
    const r = await fetch(`http://${reg.host}/v2/bench/deb/blobs/${layer.digest}`);
    let n = 0;
    for await (const c of r.body!) n += c.length;
    const httpMs = performance.now() - t0;
    const t1 = performance.now();
    const p = await pullImage({ homePath: home, ref: `${reg.host}/bench/deb:v1`, registries: plainRegistrySettings(), headroomMiB: 2048, minDiskMiB: 1024, toolTimeoutMs: 600_000, manifestTimeoutMs: 60_000 });
    const pullMs = performance.now() - t1;
    const t2 = performance.now();
    const again = await pullImage({ homePath: home, ref: `${reg.host}/bench/deb:v1`, registries: plainRegistrySettings(), headroomMiB: 2048, minDiskMiB: 1024, toolTimeoutMs: 600_000, manifestTimeoutMs: 60_000 });
    const cachedMs = performance.now() - t2;
    const mb = p.compressedBytes / 1e6;
    console.log(`image: ${mb.toFixed(1)} MB compressed (zstd), ${(p.diskBytes / 1048576).toFixed(0)} MiB disk`);
    console.log(`  HTTP GET of the blob (baseline): ${s(httpMs)}, ${(n / 1e6 / (httpMs / 1000)).toFixed(0)} MB/s`);
    console.log(`  skopeo fetch (digest-checked, decompressed): ${s(p.fetchMs)}, ${(mb / (p.fetchMs / 1000)).toFixed(0)} MB/s (${(p.fetchMs / httpMs).toFixed(1)}x the GET)`);
    console.log(`  full pull (fetch + umoci unpack + mkfs.ext4 + overlaybd import): ${s(pullMs)}`);
    console.log(`  second pull (cached by digest, manifest only): ${s(cachedMs)}, pulled=${again.pulled}`);
  } finally {
    await reg.stop();
    rmSync(home, { recursive: true, force: true });
  }
}

// (2) builds and creates on a node
{
  const world = new NodeWorld();
  const reg = await startRegistry({ netns: world.ns });
  try {
    const img = await pushImage(reg.host, "bench/deb:v1", [{ dir: tree.dir, paths: tree.paths, compression: "zstd" }], {}, undefined, world.ns);
    rmSync(img.dir, { recursive: true, force: true });
    await world.start();
    const o = await world.client("template-bench.ts", [reg.host, String(RUNS)], 1_800_000);
    console.log(`node builds (SDK Template.build, 4 steps + start/ready, QEMU TCG):`);
    console.log(`  cold build (pull + steps + ready check + snapshot commit): ${s(o.cold)}`);
    console.log(`  warm rebuild (every step and the snapshot cached): ${s(o.warm)} (${(o.cold / o.warm).toFixed(1)}x faster)`);
    console.log(`  Sandbox.create of the built template (restore of its snapshot, start command running), median of ${RUNS}: ${s(median(o.created))}`);
    console.log(`  Sandbox.create of base (baseline: restore of build-base's snapshot), median of ${RUNS}: ${s(median(o.base))}`);
    console.log(`  first request to the start command after create: ${s(median(o.firstFetch))}`);
  } finally {
    await world.dispose();
    await reg.stop();
  }
}
console.log(`load average: ${load0.toFixed(2)} at start, ${loadavg()[0]!.toFixed(2)} at end (2 cores)`);
