/**
 * Boot snapshots end to end (`[vm] boot_snapshots`, src/sandbox/boot-snapshot.ts): `agentenv
 * server` in a private namespace, the unmodified SDK, real QEMU VMs. A create asking for another
 * memory size than the base template's snapshot is a cold boot: the first one of that shape makes
 * the boot snapshot (a VM booted to envd with no root filesystem, committed), and it and every
 * later cold boot of the shape restore it and mount the sandbox's disk. The guest then runs on
 * the template's root filesystem (PID 1 pivoted too) with the disk's true size, its own host
 * name and the memory asked for; pause and resume keep its files and processes; a second
 * mount-root is refused. A boot snapshot that cannot be restored makes cold boots boot instead.
 * A boot snapshot of another tools drive is removed at the next start.
 * With the setting off, a cold boot boots.
 */
import { afterAll, expect, test } from "bun:test";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { bootManifests, logLines, NodeWorld, vmPrerequisites } from "./world.ts";

const missing = vmPrerequisites();
const worlds: NodeWorld[] = [];
afterAll(async () => {
  for (const w of worlds) await w.dispose();
}, 60_000);


type Box = Record<string, any> & { id: string };

/** What a sandbox cold-booted on the base template must show, boot snapshot or not. */
function expectBaseGuest(b: Box, marker: string): void {
  expect(b.osRelease).toBe("ID=debian");
  expect(b.rootSource).toBe("/dev/vdb");
  // the kernel mounted the tools drive as its root device (root=/dev/vda)
  expect(b.toolsSource).toBe("/dev/root");
  expect(b.pid1Root).toBe("/");
  expect(b.hostname).toBe(b.id);
  expect(b.whoami).toBe("user");
  // 384 MiB asked for: the kernel reserves some, never more than 64 MiB here
  expect(b.memTotalKiB).toBeGreaterThan(320 * 1024);
  expect(b.memTotalKiB).toBeLessThanOrEqual(384 * 1024);
  expect(b.markerAfter).toBe(marker);
  expect(b.sleepAfter).toBe(b.sleepBefore);
  expect(b.sleepBefore).toMatch(/^\d+$/);
}

test("cold boots restore one boot snapshot per shape and mount the sandbox's disk; the guest is the template's, keeps its state across pause and resume, and refuses a second mount-root", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  const w = new NodeWorld();
  worlds.push(w);
  await w.start({ AENV_LOG_LEVEL: "info" });
  expect(bootManifests(w)).toEqual([]);

  const b1 = await w.client<Box>("boot-snapshot.ts", ["create", "384", "first"], 300_000);
  expectBaseGuest(b1, "first");
  const made = logLines(w, "boot snapshot committed");
  expect(made.length).toBe(1);
  const [boot] = bootManifests(w);
  expect(boot!.id).toBe(made[0]!.snapshot);
  expect([boot!.vm.memoryMiB, boot!.vm.vcpus, boot!.memory.layers.length, boot!.tools !== undefined]).toEqual([384, 1, 1, true]);
  // the guest sees the sandbox's disk at its own size (the template's), not the 1 GiB placeholder
  // the boot snapshot's kernel probed
  const template = JSON.parse(readFileSync(join(w.home, "snapshots", "manifests", `${JSON.parse(readFileSync(join(w.home, "templates", "base", "manifest.json"), "utf8")).snapshot}.json`), "utf8"));
  expect(boot!.disk.virtualSize).toBe(1024 * 1024 * 1024);
  expect(template.disk.virtualSize).not.toBe(boot!.disk.virtualSize);
  expect(b1.diskSectors * 512).toBe(template.disk.virtualSize);
  expect(b1.again.exit).not.toBe(0);
  expect(b1.again.stderr).toContain("the root filesystem is mounted already");

  // the second cold boot of the shape restores the same boot snapshot: none is made
  const b2 = await w.client<Box>("boot-snapshot.ts", ["create", "384", "second"], 300_000);
  expectBaseGuest(b2, "second");
  expect(logLines(w, "boot snapshot committed").length).toBe(1);
  const booted = logLines(w, "sandbox booted from a boot snapshot");
  expect(booted.map((l) => [l.sandboxId, l.bootSnapshot, l.bootSnapshot === boot!.id])).toEqual([
    [b1.id, boot!.id, true],
    [b2.id, boot!.id, true],
  ]);
  expect(logLines(w, "sandbox booted").length).toBe(0);
  // each paused from a VM restored from the boot snapshot: its resume restored that pause
  expect(logLines(w, "sandbox restored").map((l) => l.sandboxId)).toEqual([b1.id, b2.id]);

  // a boot snapshot that cannot be restored (its device state damaged) costs the create nothing
  // but time: it boots, and so does the shape's next cold boot, without trying the restore again
  const state = join(w.home, "snapshots", "layers", boot!.vmState.digest.slice(7));
  writeFileSync(state, "not a QEMU migration stream");
  const b4 = await w.client<Box>("boot-snapshot.ts", ["create", "384", "fourth"], 300_000);
  expectBaseGuest(b4, "fourth");
  expect(logLines(w, "restoring the boot snapshot failed: booting").map((l) => [l.sandboxId, l.bootSnapshot])).toEqual([[b4.id, boot!.id]]);
  const b5 = await w.client<Box>("boot-snapshot.ts", ["create", "384", "fifth"], 300_000);
  expectBaseGuest(b5, "fifth");
  expect(logLines(w, "sandbox booted").map((l) => l.sandboxId)).toEqual([b4.id, b5.id]);
  expect(logLines(w, "restoring the boot snapshot failed: booting").length).toBe(1);
  expect(logLines(w, "boot snapshot committed").length).toBe(1);
  await w.stop();

  // a boot snapshot of another tools drive (an older agentenv) goes at the next start; the
  // current one stays
  const dir = join(w.home, "snapshots", "manifests");
  const staleId = "stale0boot0snapshot0";
  writeFileSync(join(dir, `${staleId}.json`), JSON.stringify({ ...boot, id: staleId, toolsKey: "0000000000000000" }));
  // off: a cold boot boots the kernel, and no boot snapshot is made
  await w.start({ AENV_LOG_LEVEL: "info", AENV__vm__boot_snapshots: "false" });
  expect(existsSync(join(dir, `${staleId}.json`))).toBe(false);
  expect(bootManifests(w).map((m) => m.id)).toEqual([boot!.id]);
  const b3 = await w.client<Box>("boot-snapshot.ts", ["create", "384", "third"], 300_000);
  expectBaseGuest(b3, "third");
  expect(logLines(w, "sandbox booted").map((l) => l.sandboxId)).toEqual([b3.id]);
  expect(logLines(w, "sandbox booted from a boot snapshot").length).toBe(0);
  expect(bootManifests(w).map((m) => m.id)).toEqual([boot!.id]);
}, 900_000);
