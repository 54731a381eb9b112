/**
 * Orchestrator lifecycle without booting VMs, over a real SQLite file: sandboxes are created
 * through the orchestrator and run as loopback guests (test/helpers/loopback-runtime.ts), over the
 * real VM runtime (its network manager not started) for templates and start-up reaping. Covers
 * expiry, events (with their records) and counters, shutdown, and start-up reconciliation of
 * what a crashed node left.
 */
import { afterEach, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { openDb, type Db } from "../../src/db/index.ts";
import { Orchestrator, orchestratorConfig, type OrchestratorCounters, type SandboxEvent, type SandboxRecord } from "../../src/orchestrator/index.ts";
import { LocalRepository } from "../../src/snapshot/index.ts";
import { commitFake } from "../snapshot/helpers.ts";
import { LoopbackRuntime } from "../helpers/loopback-runtime.ts";
import { idleVmRuntime } from "../helpers/vm-runtime.ts";
import { waitFor } from "../helpers/wait.ts";

const cleanup: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

function world(env: Record<string, string> = {}, home = mkdtempSync(join(tmpdir(), "orch-life-"))) {
  const cfg = loadConfig({ env: { AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run"), ...env } });
  const db: Db = openDb(join(home, "node.db"));
  const base = idleVmRuntime(cfg, db).runtime;
  const runtime = new LoopbackRuntime({ base, templates: env.NO_TEMPLATE ? [] : ["base"] });
  const orch = new Orchestrator(db, runtime, orchestratorConfig(cfg));
  return { home, db, orch, runtime };
}

/** Create a sandbox through the orchestrator (a loopback guest). */
function create(orch: Orchestrator, timeoutSecs = 60): Promise<SandboxRecord> {
  return orch.create({ template: "base", secure: true, timeoutSecs });
}

test("a sandbox is killed when its timeout expires; observers see each transition and the counters", async () => {
  const w = world();
  cleanup.push(() => rmSync(w.home, { recursive: true, force: true }), () => w.db.close(), () => w.orch.close());
  await w.orch.start();
  const events: SandboxEvent[] = [];
  const counters: OrchestratorCounters[] = [];
  w.orch.observe({ onEvent: (e) => events.push(e), onCounters: (c) => counters.push(c) });
  expect(counters[0]).toEqual({ running: 0, paused: 0, starting: 0, created: 0, failed: 0, killed: 0 });
  const exp1 = (await create(w.orch, 1)).id;
  const endAt = w.orch.get(exp1).endAt;
  const keep1 = (await create(w.orch, 60)).id;
  expect(w.orch.getCounters().running).toBe(2);
  const killed = (id: string) => new Promise<void>((r) => w.orch.observe({ onEvent: (e) => e.id === id && e.to === "killed" && r() }));
  await killed(exp1);
  expect(w.orch.store.get(exp1)!.state).toBe("killed");
  // killed at expiry, not before
  expect(events.find((e) => e.id === exp1 && e.to === "killing")!.at).toBeGreaterThanOrEqual(endAt);
  expect(w.orch.store.get(keep1)!.state).toBe("running");
  expect(events.map((e) => [e.id, e.from, e.to])).toEqual([
    [exp1, null, "creating"],
    [exp1, "creating", "running"],
    [keep1, null, "creating"],
    [keep1, "creating", "running"],
    [exp1, "running", "killing"],
    [exp1, "killing", "killed"],
  ]);
  // every event carries the record as it is after the change
  expect(events.map((e) => e.sandbox.state)).toEqual(events.map((e) => e.to));
  expect(events.find((e) => e.id === keep1 && e.to === "running")!.sandbox.endpoint).toEqual({ host: w.runtime.hostOf(keep1)! });
  expect(w.orch.getCounters()).toMatchObject({ running: 1, killed: 1 });
  expect(counters[counters.length - 1]).toMatchObject({ running: 1, killed: 1 });
  expect(() => w.orch.get(exp1)).toThrow(expect.objectContaining({ code: "orchestrator.not_found" }));
  // setTimeout(0): due at once
  const gone = killed(keep1);
  await w.orch.setTimeout(keep1, 0);
  await gone;
  expect(w.orch.store.get(keep1)!.state).toBe("killed");
});

test("a sandbox whose VM is lost (its disk device removed) is paused with its files, the reason in its log; one whose disk cannot be kept fails and is killed", async () => {
  const w = world();
  cleanup.push(() => rmSync(w.home, { recursive: true, force: true }), () => w.db.close(), () => w.orch.close());
  await w.orch.start();
  const events: SandboxEvent[] = [];
  w.orch.observe({ onEvent: (e) => events.push(e) });
  const lost = (await create(w.orch)).id;
  const other = (await create(w.orch)).id;
  const broken = (await create(w.orch)).id;
  const settled = (id: string, to: string) => new Promise<void>((r) => w.orch.observe({ onEvent: (e) => e.id === id && e.to === to && r() }));
  const paused = settled(lost, "paused");
  const logBefore = w.orch.sandboxLogs(lost, { limit: 1000, direction: "forward" }).length;
  const why = "root disk lost: its ublk device stopped being served: all tags aborted";
  w.runtime.lose(lost, why);
  await paused;
  const r = w.orch.store.get(lost)!;
  expect(r).toMatchObject({ state: "paused", snapshotKind: "filesystem", error: why, endpoint: null, runtimeState: { paused: true } });
  expect(w.runtime.calls).toContain(`salvage:${lost}`);
  expect(w.runtime.calls).not.toContain(`kill:${lost}`);
  expect(events.filter((e) => e.id === lost).map((e) => [e.from, e.to, e.reason ?? null])).toEqual([
    [null, "creating", null],
    ["creating", "running", null],
    ["running", "pausing", "vm_lost"],
    ["pausing", "paused", "vm_lost"],
  ]);
  // the sandbox's own log says why (what an SDK user reads); it is listed paused and connects again
  const entries = w.orch.logs.query(lost, { limit: 1000, direction: "forward" });
  expect(entries.slice(logBefore).map((e) => [e.level, e.message])).toEqual([
    ["warn", `sandbox VM lost`],
    ["warn", `sandbox paused with its files (filesystem only: the next connect boots it on its disk): ${why}`],
  ]);
  expect(w.orch.get(lost).state).toBe("paused");
  const back = await w.orch.connect(lost, 60);
  expect(back.resumed).toBe(true);
  expect(w.runtime.calls).toContain(`resume:${lost}:fs`);
  // a disk that cannot be kept: failed, and the runtime frees what is left
  w.runtime.failSalvage(broken);
  const failed = settled(broken, "failed");
  w.runtime.lose(broken, "VM exited");
  await failed;
  expect(w.orch.store.get(broken)).toMatchObject({ state: "failed", error: "VM exited; its disk could not be kept: the disk of " + broken + " cannot be kept" });
  await waitFor("the failed sandbox's leftovers to be freed", () => w.runtime.calls.includes(`kill:${broken}`));
  expect(() => w.orch.get(broken)).toThrow();
  // the other sandbox runs on; a loss reported for a sandbox that is gone changes nothing
  expect(w.orch.store.get(other)!.state).toBe("running");
  await waitFor("the counters after the failure", () => w.orch.getCounters().running === 2);
  expect(w.orch.getCounters()).toMatchObject({ running: 2, paused: 0 });
  expect(() => w.runtime.lose(broken, "again")).toThrow();
});

test("a pause that fails: the sandbox runs on when its VM does; when its VM was lost during the pause, it is paused with its files, never killed", async () => {
  const w = world();
  cleanup.push(() => rmSync(w.home, { recursive: true, force: true }), () => w.db.close(), () => w.orch.close());
  await w.orch.start();
  const events: SandboxEvent[] = [];
  w.orch.observe({ onEvent: (e) => events.push(e) });
  const intact = (await create(w.orch)).id;
  const lost = (await create(w.orch)).id;
  // the pause fails with the guest still served: the pause is undone, the VM watched again
  let gate = w.runtime.gate("pause");
  const p1 = w.orch.pause(intact);
  expect(await gate.reached).toBe(intact);
  gate.open(new Error("QMP stop timed out"));
  await expect(p1).rejects.toMatchObject({ code: "orchestrator.runtime_failed" });
  expect(w.orch.store.get(intact)).toMatchObject({ state: "running", endpoint: { host: w.runtime.hostOf(intact)! } });
  expect(w.runtime.calls).not.toContain(`kill:${intact}`);
  expect(events.filter((e) => e.id === intact).map((e) => [e.from, e.to])).toEqual([
    [null, "creating"],
    ["creating", "running"],
    ["running", "pausing"],
    ["pausing", "running"],
  ]);
  // its end is watched again: a later loss keeps its files
  const intactPaused = new Promise<void>((r) => w.orch.observe({ onEvent: (e) => e.id === intact && e.to === "paused" && r() }));
  w.runtime.lose(intact, "VM exited");
  await intactPaused;
  expect(w.orch.store.get(intact)).toMatchObject({ state: "paused", snapshotKind: "filesystem", error: "VM exited" });
  // the VM is lost while its pause runs (its VMM killed): the pause fails, the loss is seen, the files are kept
  gate = w.runtime.gate("pause");
  const p2 = w.orch.pause(lost);
  expect(await gate.reached).toBe(lost);
  const lostPaused = new Promise<void>((r) => w.orch.observe({ onEvent: (e) => e.id === lost && e.to === "paused" && r() }));
  w.runtime.lose(lost, "sandbox VM exited unexpectedly");
  gate.open(new Error("QMP connection closed"));
  await expect(p2).rejects.toMatchObject({ code: "orchestrator.runtime_failed" });
  await lostPaused;
  expect(w.orch.store.get(lost)).toMatchObject({ state: "paused", snapshotKind: "filesystem", error: "sandbox VM exited unexpectedly", endpoint: null });
  expect(w.runtime.calls.filter((c) => c.endsWith(`:${lost}`))).toEqual([`start:${lost}`, `pause:${lost}`, `salvage:${lost}`]);
  expect(events.filter((e) => e.id === lost).map((e) => [e.from, e.to, e.reason ?? null])).toEqual([
    [null, "creating", null],
    ["creating", "running", null],
    ["running", "pausing", "request"],
    ["pausing", "running", null],
    ["running", "pausing", "vm_lost"],
    ["pausing", "paused", "vm_lost"],
  ]);
  // both connect again (cold boots on their disks)
  expect((await w.orch.connect(lost, 60)).resumed).toBe(true);
  expect((await w.orch.connect(intact, 60)).resumed).toBe(true);
  expect(w.orch.getCounters()).toMatchObject({ running: 2, paused: 0, failed: 0 });
});

test("shutdown kills live sandboxes and refuses new work with 503", async () => {
  const w = world();
  cleanup.push(() => rmSync(w.home, { recursive: true, force: true }), () => w.db.close());
  await w.orch.start();
  const live1 = (await create(w.orch)).id;
  const live2 = (await create(w.orch)).id;
  expect(await w.orch.close()).toEqual({ killed: 2, paused: 0, detached: 0, failed: 0 });
  expect([w.orch.store.get(live1)!.state, w.orch.store.get(live2)!.state]).toEqual(["killed", "killed"]);
  expect(await w.orch.close()).toEqual({ killed: 0, paused: 0, detached: 0, failed: 0 }); // once only
  await expect(w.orch.create({ template: "base", secure: true })).rejects.toMatchObject({ code: "orchestrator.shutting_down" });
});

test("start-up reconciliation: sandboxes a crashed node left running become killed, work dirs go, paused ones stay; orphan snapshots go", async () => {
  const home = mkdtempSync(join(tmpdir(), "orch-life-"));
  cleanup.push(() => rmSync(home, { recursive: true, force: true }));
  // a previous run: one running, one pausing (interrupted), one paused, with their directories
  const first = world({}, home); // never started: no timers outlive its database
  const wasrun = (await create(first.orch)).id;
  const waspausing = (await create(first.orch)).id;
  const waspaused = (await create(first.orch)).id;
  await first.orch.pause(waspaused);
  const held = first.runtime.gate("pause"); // the node dies while this pause is in the runtime
  void first.orch.pause(waspausing).catch(() => {});
  await held.reached;
  expect(first.orch.store.get(waspausing)!.state).toBe("pausing");
  for (const id of [wasrun, waspausing, waspaused, "stray"]) mkdirSync(join(home, "sandboxes", id), { recursive: true });
  // snapshots the crashed run left: a pause snapshot no paused sandbox names, a fork checkpoint,
  // a user snapshot deleted while in use (tombstoned), and a user snapshot that stays
  const repo = new LocalRepository(join(home, "snapshots"), { verifyDigests: true, gcGraceMs: 0 });
  const orphanPause = commitFake(repo, { kind: "pause", sandboxId: wasrun, disk: ["o-disk"], memory: ["o-mem"] });
  const fork = commitFake(repo, { kind: "fork", sandboxId: wasrun, disk: ["f-disk"], memory: ["f-mem"] });
  const deleted = commitFake(repo, { kind: "user", sandboxId: wasrun, disk: ["d-disk"], memory: ["d-mem"] });
  const kept = commitFake(repo, { kind: "user", sandboxId: wasrun, names: ["keep-me"], disk: ["k-disk"], memory: ["k-mem"] });
  repo.tombstone(deleted.id);
  // a commit the crash cut short (its process is gone): the layer it had linked, and its staging
  const cut = join(repo.root, "staging", "999999999.cut");
  mkdirSync(cut);
  const cutLayer = `sha256:${new Bun.CryptoHasher("sha256").update("cut").digest("hex")}`;
  writeFileSync(repo.layerPath(cutLayer), "cut");
  writeFileSync(join(cut, ".linked-layers"), `${cutLayer}\n`);
  // a young layer nothing names or records (another writer's): the grace period keeps it
  const loose = `sha256:${new Bun.CryptoHasher("sha256").update("loose").digest("hex")}`;
  writeFileSync(repo.layerPath(loose), "loose");
  first.db.close(); // the node died without shutting down

  // the default grace period (600 s): every layer above is seconds old
  const second = world({}, home);
  cleanup.push(() => second.db.close(), () => second.orch.close());
  await second.orch.start();
  expect(second.orch.store.get(wasrun)).toMatchObject({ state: "killed", error: "node restarted while running", endpoint: null });
  expect(second.orch.store.get(waspausing)).toMatchObject({ state: "killed", error: "node restarted while pausing" });
  expect(second.orch.store.get(waspaused)!.state).toBe("paused");
  expect(second.orch.list({}).items.map((r) => [r.id, r.state])).toEqual([[waspaused, "paused"]]);
  expect(second.orch.getCounters()).toMatchObject({ running: 0, paused: 1 });
  // a paused sandbox's state is its snapshot: no work dir is needed, none is left
  expect(readdirSync(join(home, "sandboxes"))).toEqual([]);
  expect(repo.list({ hidden: true }).map((m) => m.id)).toEqual([kept.id]);
  for (const m of [orphanPause, fork, deleted]) for (const l of [...m.disk.layers, ...m.memory!.layers, m.vmState!]) expect(repo.hasLayer(l)).toBe(false);
  for (const l of [...kept.disk.layers, ...kept.memory!.layers, kept.vmState!]) expect(repo.hasLayer(l)).toBe(true);
  expect(repo.hasLayer({ digest: cutLayer, size: 3 })).toBe(false);
  expect(readdirSync(join(repo.root, "staging"))).toEqual([]);
  expect(repo.hasLayer({ digest: loose, size: 5 })).toBe(true);
  first.runtime.gate("pause").open(); // let the dead node's held pause end (its database is closed)
  await first.runtime.close();
});

test("create refuses bad timeouts and unknown templates before making anything", async () => {
  const w = world({ AENV__orchestrator__max_timeout_secs: "600", NO_TEMPLATE: "1" });
  cleanup.push(() => rmSync(w.home, { recursive: true, force: true }), () => w.db.close(), () => w.orch.close());
  await w.orch.start();
  await expect(w.orch.create({ template: "base", secure: true, timeoutSecs: 601 })).rejects.toMatchObject({ code: "orchestrator.bad_request", details: { timeout: 601 } });
  await expect(w.orch.create({ template: "base", secure: true })).rejects.toMatchObject({ code: "orchestrator.template_not_found" });
  expect(w.orch.store.countByState()).toEqual({});
});
