/**
 * Pause and resume, repeatedly, with the real SDK on real VMs: every resume keeps the files and
 * answers files.read and commands.run at once. A resumed VM maps its snapshot's memory file as
 * RAM, so the next pause must write a new snapshot beside it (it used to delete that file and
 * then refuse: "snapshot memPath is the live RAM file", killing the sandbox).
 */
import { afterAll, expect, test } from "bun:test";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { NodeWorld, vmPrerequisites } from "./world.ts";

const missing = vmPrerequisites();
let world: NodeWorld | undefined;

afterAll(async () => {
  await world?.dispose();
}, 60_000);

test("pause -> resume -> files.read + commands.run, three rounds on one sandbox; the snapshot dir keeps only the last snapshot", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  world = new NodeWorld();
  await world.start();
  const o = await world.client<{ rounds: number; failures: string[]; id: string; snapshotFiles: string[] }>("resume-loop.ts", ["3"], 400_000);
  expect(o.failures).toEqual([]);
  expect(o.rounds).toBe(3);
  // after the last pause: one state + memory pair, numbered by pause
  expect(o.snapshotFiles).toEqual(["vm-3.mem", "vm-3.state"]);
  expect(readdirSync(join(world.home, "snapshots"))).toEqual([]);
  expect(await world.stop()).toBe(0);
}, 420_000);
