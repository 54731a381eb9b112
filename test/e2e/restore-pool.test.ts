/**
 * The restore pool end to end (issue 9 item 7, `[pool.restore]`): `agentenv server` in a private
 * namespace, the unmodified SDK, real QEMU VMs. A create of `base` registers its snapshot with the
 * pool, which restores VMs of it ahead (envd initialised, one command run, paused); the next
 * creates adopt them: the sandbox id is the pooled VM's, and each sandbox still gets its own env
 * vars, host name, clock, token and disk from its create. The pool refills below its low
 * watermark; a create from another snapshot moves the pool to it; a deleted snapshot's pooled
 * VMs go. A node SIGKILLed with pooled VMs: the next start adopts its sandboxes and reaps the pool.
 */
import { afterAll, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { logLines, NodeWorld, qemuPidsUnder, vmPrerequisites } from "./world.ts";
import { waitFor } from "../helpers/wait.ts";

const POOL = { AENV_LOG_LEVEL: "info", AENV__pool__restore__low_watermark: "1", AENV__pool__restore__high_watermark: "2", AENV__pool__restore__fill_delay_ms: "0" };
const missing = vmPrerequisites();
let world: NodeWorld | undefined;
afterAll(async () => {
  await world?.dispose();
}, 60_000);


/** Wait (bounded) until the node has logged `n` lines `msg` matching `f`. */
async function untilLogged(w: NodeWorld, msg: string, n: number, f: (l: Record<string, any>) => boolean = () => true): Promise<Record<string, any>[]> {
  try {
    return await waitFor(`${n} x "${msg}" in the node's log`, () => {
      const got = logLines(w, msg).filter(f);
      return got.length >= n && got;
    }, { timeoutMs: 120_000, maxIntervalMs: 100 });
  } catch (e) {
    throw new Error(`${e instanceof Error ? e.message : String(e)}: ${w.log.slice(-3000)}`);
  }
}

type Box = { id: string; env: string; hostname: string; user: string; clock: number; hostBefore: number; hostAfter: number; seen: string; noTokenStatus: number; createMs: number };

/** What every sandbox must be, adopted or not: its own env var, host name, clock, token. */
function expectOwn(b: Box, who: string): void {
  expect([b.env, b.hostname, b.user, b.noTokenStatus]).toEqual([who, b.id, "user", 401]);
  expect(b.clock).toBeGreaterThanOrEqual(b.hostBefore - 3000);
  expect(b.clock).toBeLessThanOrEqual(b.hostAfter + 5000);
}

test("creates adopt VMs restored ahead; each sandbox has its own env, host name, clock, token and disk; the pool refills, follows the snapshot created from, and drops a deleted snapshot's VMs", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  world = new NodeWorld();
  await world.start(POOL);
  const w = world;
  const base = JSON.parse(readFileSync(join(w.home, "templates", "base", "manifest.json"), "utf8")).snapshot as string;

  // the first create is a restore on request; it makes `base` the pooled snapshot
  const b0 = await w.client<Box>("restore-pool.ts", ["create", "box0"]);
  expect(logLines(w, "sandbox restored").map((l) => l.sandboxId)).toEqual([b0.id]);
  const ready = await untilLogged(w, "restore pool VM ready", 2);
  expect(ready.map((l) => l.snapshot)).toEqual([base, base]);
  expect(ready.map((l) => l.ready)).toEqual([1, 2]);
  expect(logLines(w, "restore pool VM restored").length).toBe(2);
  expect(qemuPidsUnder(w.home, w.memDir).length).toBe(3); // box0 + 2 pooled (paused)

  // the next two adopt them: the sandbox ids are the pooled VMs' ids
  const b1 = await w.client<Box>("restore-pool.ts", ["create", "box1"]);
  const b2 = await w.client<Box>("restore-pool.ts", ["create", "box2"]);
  const adopted = logLines(w, "sandbox started from the restore pool");
  expect(adopted.map((l) => l.sandboxId)).toEqual([b1.id, b2.id]);
  expect(adopted.every((l) => l.pooled === true && l.restored === true && l.base === base)).toBe(true);
  expect(new Set([b1.id, b2.id])).toEqual(new Set(ready.map((l) => l.sandboxId)));
  expect(logLines(w, "sandbox restored").length).toBe(1); // nothing restored on request since box0
  for (const [b, who] of [[b0, "box0"], [b1, "box1"], [b2, "box2"]] as const) {
    expectOwn(b, who);
    expect(b.seen).toBe("unseen"); // box0's file is on box0's disk only
  }
  // one was left after box1 (not below low = 1): refilled only after box2 took the last
  const refilled = await untilLogged(w, "restore pool VM ready", 4);
  expect(refilled.slice(2).map((l) => l.ready)).toEqual([1, 2]);
  expect(qemuPidsUnder(w.home, w.memDir).length).toBe(5);

  // a create from another snapshot: restored on request, and the pool moves to that snapshot
  // ([pool.restore] snapshots = 1): base's pooled VMs are discarded, two of the new one made
  const snap = (await w.client<{ snapshotId: string }>("restore-pool.ts", ["snapshot", b1.id])).snapshotId;
  const b3 = await w.client<Box>("restore-pool.ts", ["create", "box3", snap]);
  expectOwn(b3, "box3");
  expect(b3.seen).toBe("seen"); // box1 wrote it before the snapshot
  expect(logLines(w, "sandbox restored").map((l) => l.sandboxId)).toEqual([b0.id, b3.id]);
  const gone = await untilLogged(w, "restore pool VM discarded", 2);
  expect(gone.map((l) => [l.snapshot, l.why])).toEqual([
    [base, "snapshot no longer pooled"],
    [base, "snapshot no longer pooled"],
  ]);
  const readyU = await untilLogged(w, "restore pool VM ready", 2, (l) => l.snapshot === snap);
  expect(readyU.map((l) => l.ready)).toEqual([1, 2]);
  await w.client("restore-pool.ts", ["kill", b0.id, b1.id, b2.id]);
  expect(qemuPidsUnder(w.home, w.memDir).length).toBe(3); // box3 + 2 pooled of the snapshot

  // deleting the snapshot (box3 still runs from it) discards its pooled VMs
  expect((await w.client<{ deleted: boolean }>("restore-pool.ts", ["delete-snapshot", snap])).deleted).toBe(true);
  const dropped = await untilLogged(w, "restore pool VM discarded", 4);
  expect(dropped.slice(2).map((l) => [l.snapshot, l.why])).toEqual([
    [snap, "snapshot deleted or replaced"],
    [snap, "snapshot deleted or replaced"],
  ]);
  await waitFor("the dropped pool VMs to stop", () => qemuPidsUnder(w.home, w.memDir).length === 1, { timeoutMs: 10_000 });
  for (const l of dropped) expect(existsSync(join(w.home, "sandboxes", l.sandboxId))).toBe(false);
  await w.client("restore-pool.ts", ["kill", b3.id]);
  expect(await w.stop()).toBe(0);
  expect(qemuPidsUnder(w.home, w.memDir)).toEqual([]);
  expect(w.slotNamespaces()).toEqual([]);
  console.log(`restore pool: creates ${[b0, b1, b2, b3].map((b) => b.createMs).join(", ")} ms (box1, box2 adopted)`);
}, 600_000);

test("kill -9 of the node with pooled VMs: the next start adopts the sandbox's VMM and reaps the pool's (VMMs, work dirs, disk mounts)", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  await world?.dispose();
  world = new NodeWorld();
  await world.start(POOL);
  const w = world;
  const b = await w.client<Box>("restore-pool.ts", ["create", "box0"]);
  const pooled = (await untilLogged(w, "restore pool VM ready", 2)).map((l) => l.sandboxId as string);
  const vmmOf = (id: string) => qemuPidsUnder(join(w.home, "sandboxes", id));
  const sandboxVmm = vmmOf(b.id);
  expect(sandboxVmm.length).toBe(1);
  expect(pooled.flatMap(vmmOf).length).toBe(2);
  await w.crash();
  // left behind by the crash
  expect(qemuPidsUnder(w.home, w.memDir).length).toBe(3);
  for (const id of pooled) expect(existsSync(join(w.home, "sandboxes", id))).toBe(true);
  await w.start(POOL);
  // the sandbox runs on in the same VMM (adopted, docs/survival.md); the pool's VMs, which no
  // sandbox record names, are reaped with their work dirs and disk mounts
  expect(vmmOf(b.id)).toEqual(sandboxVmm);
  expect(existsSync(join(w.home, "sandboxes", b.id))).toBe(true);
  expect(pooled.flatMap(vmmOf)).toEqual([]);
  for (const id of pooled) expect(existsSync(join(w.home, "sandboxes", id))).toBe(false);
  const mounts = readFileSync("/proc/self/mountinfo", "utf8").split("\n").filter((l) => pooled.some((id) => l.includes(join(w.home, "sandboxes", id))));
  expect(mounts).toEqual([]);
  await w.client("restore-pool.ts", ["kill", b.id]);
  await waitFor("the killed sandbox's VMM to stop", () => vmmOf(b.id).length === 0, { timeoutMs: 30_000 });
  expect(await w.stop()).toBe(0);
  expect(qemuPidsUnder(w.home, w.memDir)).toEqual([]);
}, 600_000);
