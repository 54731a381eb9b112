/**
 * Templates are snapshots (`template build-base` ends with `commitTemplateSnapshot`): a copy of
 * the test home's base template, in a data dir of its own, is booted once in a real QEMU VM
 * (private netns with a slot-shaped tap), envd is probed, and the paused VM is committed: the
 * manifest names the template's layer, a disk diff, one memory layer and the device state, with
 * the VM shape from `[template]`; the template manifest names it; a second call is a cache hit;
 * a re-commit for a new build tombstones the old one. Bad templates are typed errors. Nothing is
 * left behind (VMM, netns, build folder).
 */
import { afterAll, expect, test } from "bun:test";
import { existsSync, linkSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { commitTemplateSnapshot } from "../../src/sandbox/template-snapshot.ts";
import { LocalRepository } from "../../src/snapshot/index.ts";
import { readManifest, writeManifest } from "../../src/template/index.ts";
import { resolveTools } from "../../src/tools/index.ts";
import { resolveKernelPath } from "../../src/vmm/index.ts";
import { qemuPidsUnder } from "../e2e/world.ts";
import { TEST_HOME, testConfig } from "../vmm/qemu/helpers.ts";

const home = mkdtempSync("/tmp/aenv-tplsnap-");
afterAll(() => rmSync(home, { recursive: true, force: true }));

test("boot once, commit the template's snapshot; cached on the second call; re-commit tombstones the old one", async () => {
  const src = readManifest(TEST_HOME, "base");
  const dir = join(home, "templates", "tcopy");
  mkdirSync(dir, { recursive: true });
  for (const f of [src.rootfs, ...src.layers]) linkSync(join(TEST_HOME, "templates", "base", f), join(dir, f));
  writeManifest(home, { ...src, name: "tcopy", snapshot: undefined });
  symlinkSync(join(TEST_HOME, "tools"), join(home, "tools")); // the tools drive VMs boot through
  const cfg = testConfig({
    AENV_HOME_PATH: home,
    AENV_RUNTIME_PATH: join(home, "run"),
    AENV__kernel__path: resolveKernelPath(testConfig()),
    AENV__template__memory_mib: "384",
    AENV__qemu__memory_dir: join(home, "mem"),
  });
  const phases: string[] = [];
  const r = await commitTemplateSnapshot(cfg, "tcopy", (p, d) => phases.push(`${p}: ${d}`));
  expect(r.built).toBe(true);
  expect(r.memoryBytes).toBeGreaterThan(8 << 20); // a booted Debian with envd running
  expect(r.memoryBytes).toBeLessThan(384 << 20);
  const repo = new LocalRepository(join(home, "snapshots"), { verifyDigests: true, gcGraceMs: 0 });
  const m = repo.get(r.snapshotId);
  expect(m).toMatchObject({ kind: "template", parent: null, source: { sandboxId: null, templateId: "tcopy" }, templateBuild: src.buildKey, envd: { accessToken: null } });
  expect(m.vm).toMatchObject({ driver: "qemu", vcpus: 1, memoryMiB: 384, mac: "02:ae:fe:00:00:01", bootArgs: src.bootArgs });
  expect(m.memory!.size).toBe(384 << 20);
  expect(m.memory!.layers.length).toBe(1);
  expect(m.vmState!.size).toBeLessThan(4 << 20); // device state only
  // the template's own layer (hard-linked in, not copied) and the boot's writes on top
  expect(m.disk.layers[0]!.digest).toBe(repo.digestOf(join(dir, src.layers[0]!)).digest);
  expect(m.disk.layers.length).toBe(2);
  // the tools drive it booted through, linked in: a restore attaches this very image
  expect(m.tools!.digest).toBe(repo.digestOf(resolveTools(home).path).digest);
  expect(m.toolsKey).toBe(resolveTools(home).key); // a new tools drive makes it stale
  for (const l of [...m.disk.layers, ...m.memory!.layers, m.vmState!, m.tools!]) repo.verifyLayer(l);
  expect(readManifest(home, "tcopy")).toMatchObject({ snapshot: m.id, cpuCount: 1, memoryMB: 384 });
  expect(phases.some((p) => p.includes("envd ready"))).toBe(true);
  // nothing left: no VMM, no build netns, no build folder
  expect(qemuPidsUnder(home)).toEqual([]);
  expect(readdirSync("/run/netns").filter((n) => n === `aenvtpl${process.pid}`)).toEqual([]);
  expect(readdirSync(join(home, "templates", ".snapshot"))).toEqual([]);

  // current: no boot
  const again = await commitTemplateSnapshot(cfg, "tcopy");
  expect(again).toEqual({ snapshotId: m.id, built: false, memoryBytes: 0, readyMs: 0 });

  // a new build of the template gets a new snapshot; the old one is tombstoned (kept for running users)
  writeManifest(home, { ...readManifest(home, "tcopy"), buildKey: "newbuild" });
  const next = await commitTemplateSnapshot(cfg, "tcopy");
  expect(next.built).toBe(true);
  expect(next.snapshotId).not.toBe(m.id);
  expect(repo.isTombstoned(m.id)).toBe(true);
  expect(repo.get(next.snapshotId).templateBuild).toBe("newbuild");
}, 300_000);

test("a template without layers or an unknown one is a typed error; nothing is booted", async () => {
  const cfg = testConfig({ AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run") });
  const dir = join(home, "templates", "raw");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "rootfs.ext4"), "x");
  writeManifest(home, { name: "raw", rootfs: "rootfs.ext4", layers: [], bootArgs: "root=/dev/vda", diskBytes: 4096, buildKey: "k", createdAt: new Date().toISOString() });
  await expect(commitTemplateSnapshot(cfg, "raw")).rejects.toMatchObject({ code: "template.snapshot_failed" });
  await expect(commitTemplateSnapshot(cfg, "nosuch")).rejects.toMatchObject({ code: "template.not_found" });
  expect(existsSync(join(home, "templates", ".snapshot", `raw-${process.pid}`))).toBe(false);
  expect(JSON.parse(readFileSync(join(dir, "manifest.json"), "utf8")).snapshot).toBeUndefined();
});
