/**
 * Pause and resume, repeatedly, with the real SDK on real VMs: every resume keeps the files and
 * answers files.read and commands.run at once. Each pause writes a `pause` snapshot on top of the
 * one the VM ran from (one more memory and disk layer) and drops the previous one: the repository
 * holds exactly one pause snapshot per paused sandbox, and none after the kill.
 */
import { afterAll, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { NodeWorld, vmPrerequisites } from "./world.ts";

const missing = vmPrerequisites();
let world: NodeWorld | undefined;

afterAll(async () => {
  await world?.dispose();
}, 60_000);

test("pause -> resume -> files.read + commands.run, three rounds on one sandbox; one pause snapshot at a time", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  world = new NodeWorld();
  const layersBefore = readdirSync(join(world.home, "snapshots", "layers")).length;
  // the base template is a snapshot (build-base commits it): sandboxes are restores of it
  const snap = JSON.parse(readFileSync(join(world.home, "templates", "base", "manifest.json"), "utf8")).snapshot;
  if (!snap) throw new Error("the base template in the test home has no snapshot: rebuild it with `agentenv template build-base`");
  const tpl = JSON.parse(readFileSync(join(world.home, "snapshots", "manifests", `${snap}.json`), "utf8"));
  const [m0, d0] = [tpl.memory.layers.length, tpl.disk.layers.length];
  // no grace period: layers a pause superseded are collected at once (in-process commits are pinned)
  await world.start({ AENV__snapshot__gc_grace_secs: "0" });
  const o = await world.client<{ rounds: number; failures: string[]; afterPause: { id: string; memoryLayers: number; diskLayers: number }[][]; afterKill: unknown[] }>("resume-loop.ts", ["3"], 400_000);
  expect(o.failures).toEqual([]);
  expect(o.rounds).toBe(3);
  // after pause i: one pause snapshot, the template's layers + i + 1 memory diffs; a disk diff
  // only when the guest had written back to its disk since the last pause (files written just
  // before a pause may still sit in the guest's page cache, which the memory diff holds)
  expect(o.afterPause.map((s) => s.length)).toEqual([1, 1, 1]);
  expect(o.afterPause.map((s) => s[0]!.memoryLayers)).toEqual([m0 + 1, m0 + 2, m0 + 3]);
  const disk = o.afterPause.map((s) => s[0]!.diskLayers);
  disk.forEach((n, i) => expect(n >= d0 && n <= d0 + i + 1 && (i === 0 || n >= disk[i - 1]!)).toBe(true));
  expect(new Set(o.afterPause.map((s) => s[0]!.id)).size).toBe(3);
  expect(o.afterKill).toEqual([]);
  // the repository is back to the template's layers: pause layers were collected
  expect(await world.stop()).toBe(0);
  expect(readdirSync(join(world.home, "snapshots", "layers")).length).toBe(layersBefore);
  expect(readdirSync(join(world.home, "sandboxes"))).toEqual([]);
}, 420_000);
