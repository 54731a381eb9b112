/**
 * What a restarted node makes of the sandboxes its predecessor left (src/orchestrator/recovery.ts,
 * issue 27), over a real SQLite file and the lifecycle event recorder, with loopback guests
 * (test/helpers/loopback-runtime.ts): one LoopbackRuntime lives on across two orchestrators, as
 * VMMs outlive a node, and the second orchestrator's start adopts what it still serves. Adopted
 * sandboxes are not recorded killed and keep their run (a later kill records its execution from
 * the first start); a guest that died while no node ran comes back paused with its files; a pause
 * cut by the restart is undone, a resume goes back to paused, a create is gone; a deadline that
 * passed while no node ran fires at once (fake clock). `shutdown_action = "detach"` leaves the
 * running sandboxes to the next orchestrator.
 */
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { openDb, type Db } from "../../src/db/index.ts";
import { EventsService, eventsConfig } from "../../src/events/index.ts";
import { Orchestrator, orchestratorConfig, type SandboxEvent } from "../../src/orchestrator/index.ts";
import { FakeClock } from "../helpers/clock.ts";
import { LoopbackRuntime } from "../helpers/loopback-runtime.ts";
import { idleVmRuntime } from "../helpers/vm-runtime.ts";

const cleanup: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/** One node's orchestrator and event recorder over `home`'s database and `runtime` (which outlives it). */
function node(home: string, runtime: LoopbackRuntime, clock: FakeClock, env: Record<string, string> = {}) {
  const cfg = loadConfig({ env: { AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run"), ...env } });
  const db: Db = openDb(join(home, "node.db"));
  const orch = new Orchestrator(db, runtime, orchestratorConfig(cfg), clock);
  const events = new EventsService(db, eventsConfig(cfg), orch, () => clock.now());
  const seen: SandboxEvent[] = [];
  orch.observe({ onEvent: (e) => seen.push(e) });
  return { cfg, db, orch, events, seen };
}

/** A runtime that outlives the nodes of `home` (its base reaps what a real runtime would, nothing here). */
function runtimeOf(home: string): LoopbackRuntime {
  const cfg = loadConfig({ env: { AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run") } });
  const db = openDb(join(home, "base.db"));
  cleanup.push(() => db.close());
  return new LoopbackRuntime({ base: idleVmRuntime(cfg, db).runtime, templates: ["base"] });
}

test("a restarted node adopts what still runs, keeps the files of a guest that died, settles cut operations; no adopted sandbox is recorded killed", async () => {
  const home = mkdtempSync(join(tmpdir(), "orch-recover-"));
  cleanup.push(() => rmSync(home, { recursive: true, force: true }));
  const runtime = runtimeOf(home);
  const clock = new FakeClock();
  const first = node(home, runtime, clock); // never started: no timer of it outlives its database
  const idle = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 })).id;
  const died = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 })).id;
  const pausing = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 })).id;
  const resuming = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 })).id;
  await first.orch.pause(resuming);
  const hostOfIdle = runtime.hostOf(idle)!;
  // cut halfway: a pause, a resume and a create held in the runtime when the node dies
  const pauseGate = runtime.gate("pause");
  void first.orch.pause(pausing).catch(() => {});
  await pauseGate.reached;
  const resumeGate = runtime.gate("resume");
  void first.orch.connect(resuming, 60).catch(() => {});
  await resumeGate.reached;
  const startGate = runtime.gate("start");
  void first.orch.create({ template: "base", secure: true }).catch(() => {});
  const creating = await startGate.reached;
  expect(["pausing", "resuming", "creating"].map((s, i) => [first.orch.store.get([pausing, resuming, creating][i]!)!.state, s])).toEqual([
    ["pausing", "pausing"],
    ["resuming", "resuming"],
    ["creating", "creating"],
  ]);
  const before = first.events.list({ offset: 0, limit: 100, orderAsc: true, types: [] });
  // the node dies: no shutdown; the guests live on, one of them dies while no node runs
  await first.events.close();
  first.db.close();
  runtime.die(died);

  clock.advance(60_000);
  const second = node(home, runtime, clock);
  cleanup.push(() => second.db.close(), () => second.events.close(), () => second.orch.close());
  await second.orch.start();
  second.events.start();
  // the dead node's held calls end without acting (its database is closed)
  for (const g of [pauseGate, resumeGate, startGate]) g.open(new Error("the node died"));
  expect(runtime.calls.filter((c) => c.startsWith("recover:")).sort()).toEqual([`recover:${idle}`, `recover:${died}`, `recover:${pausing}`].sort());
  const state = (id: string) => second.orch.store.get(id)!;
  // adopted: the same guest at the same address, running, its end watched
  expect(state(idle)).toMatchObject({ state: "running", endpoint: { host: hostOfIdle }, error: null });
  expect(runtime.hostOf(idle)).toBe(hostOfIdle);
  // the pause cut halfway is undone: the guest runs on
  expect(state(pausing)).toMatchObject({ state: "running", endpoint: { host: runtime.hostOf(pausing)! } });
  // the guest that died while no node ran: paused, filesystem only, saying why
  expect(state(died)).toMatchObject({ state: "paused", snapshotKind: "filesystem", error: "its VMM died while no node watched", endpoint: null });
  // the resume cut halfway: paused again; the create: gone
  expect(state(resuming)).toMatchObject({ state: "paused", error: "the node restarted while the sandbox resumed; it stays paused" });
  expect(state(creating)).toMatchObject({ state: "killed", error: "node restarted while creating" });
  const changes = second.seen.map((e) => [e.id, e.from, e.to, e.reason ?? null]);
  expect(changes.sort()).toEqual(
    [
      [resuming, "resuming", "paused", null],
      [pausing, "pausing", "running", null],
      [died, "running", "pausing", "vm_lost"],
      [died, "pausing", "paused", "vm_lost"],
      [creating, "creating", "killed", "orphaned"],
    ].sort(),
  );
  expect(second.orch.getCounters()).toMatchObject({ running: 2, paused: 2 });
  // the adopted sandbox's log says so; the dead one's says why
  expect(second.orch.logs.query(idle, { limit: 1000, direction: "backward" })[0]).toMatchObject({ level: "info", source: "lifecycle", message: "sandbox adopted by the restarted node: its VM ran on" });
  expect(second.orch.logs.query(died, { limit: 1000, direction: "backward" })[0]).toMatchObject({ level: "warn", message: "sandbox paused with its files (filesystem only: the next connect boots it on its disk): its VMM died while no node watched" });

  // events: nothing for the adopted sandboxes; the dead one's run ends paused (vm_lost); the cut create killed
  const after = second.events.list({ offset: 0, limit: 100, orderAsc: true, types: [] });
  expect(after.slice(0, before.length)).toEqual(before);
  const added = after.slice(before.length);
  expect(added.map((e) => `${e.sandboxId} ${e.type}`).sort()).toEqual([`${died} sandbox.lifecycle.paused`, `${creating} sandbox.lifecycle.killed`].sort());
  const createdOf = (id: string) => before.find((e) => e.sandboxId === id && e.type === "sandbox.lifecycle.created")!;
  const lostEvent = added.find((e) => e.sandboxId === died)!;
  expect(lostEvent.eventData).toMatchObject({ pause_reason: "vm_lost", snapshot_kind: "filesystem", error: "its VMM died while no node watched", execution: { started_at: createdOf(died).timestamp } });
  expect(lostEvent.sandboxExecutionId).toBe(createdOf(died).sandboxExecutionId);
  expect(added.find((e) => e.sandboxId === creating)!.eventData).toMatchObject({ kill_reason: "orphaned" });

  // a kill of an adopted sandbox ends the run its create began, with its execution data
  await second.orch.kill(idle);
  const killed = second.events.list({ offset: 0, limit: 100, orderAsc: false, types: ["sandbox.lifecycle.killed"] })[0]!;
  expect(killed).toMatchObject({ sandboxId: idle, sandboxExecutionId: createdOf(idle).sandboxExecutionId });
  expect(killed.eventData).toMatchObject({ kill_reason: "request", execution: { started_at: createdOf(idle).timestamp, vcpu_count: 1, memory_mb: 512 } });
  // the sandbox that died connects again: a cold boot on its disk
  expect((await second.orch.connect(died, 60)).resumed).toBe(true);
  expect(runtime.calls.at(-1)).toBe(`resume:${died}:fs`);
});

test("a deadline that passed while no node ran fires at once at the start: kill, or pause with autoPause", async () => {
  const home = mkdtempSync(join(tmpdir(), "orch-recover-"));
  cleanup.push(() => rmSync(home, { recursive: true, force: true }));
  const runtime = runtimeOf(home);
  const clock = new FakeClock();
  const first = node(home, runtime, clock); // never started: no timer of it outlives its database
  const killMe = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 30 })).id;
  const pauseMe = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 30, autoPause: true })).id;
  const later = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 })).id;
  const endAt = first.orch.get(killMe).endAt;
  await first.events.close();
  first.db.close();

  clock.advance(120_000); // the node was down past two deadlines
  const second = node(home, runtime, clock);
  cleanup.push(() => second.db.close(), () => second.events.close(), () => second.orch.close());
  await second.orch.start();
  // adopted first (still running, deadlines in the past), then due at once: the timer is armed now
  expect([killMe, pauseMe, later].map((id) => second.orch.store.get(id)!.state)).toEqual(["running", "running", "running"]);
  expect(second.orch.expiry.armedAt).toBe(endAt);
  const settled = Promise.all([killMe, pauseMe].map((id) => new Promise<void>((r) => second.orch.observe({ onEvent: (e) => e.id === id && (e.to === "killed" || e.to === "paused") && r() }))));
  clock.advance(0);
  await settled;
  expect([killMe, pauseMe, later].map((id) => second.orch.store.get(id)!.state)).toEqual(["killed", "paused", "running"]);
  expect(second.seen.filter((e) => e.to === "killing" || e.to === "pausing").map((e) => [e.id, e.reason])).toEqual(
    expect.arrayContaining([
      [killMe, "timeout"],
      [pauseMe, "timeout"],
    ]),
  );
  expect(second.orch.expiry.armedAt).toBe(second.orch.get(later).endAt);
});

test("shutdown_action = detach leaves running sandboxes to the next node, which adopts them; paused ones stay paused", async () => {
  const home = mkdtempSync(join(tmpdir(), "orch-recover-"));
  cleanup.push(() => rmSync(home, { recursive: true, force: true }));
  const runtime = runtimeOf(home);
  const clock = new FakeClock();
  const first = node(home, runtime, clock, { AENV__orchestrator__shutdown_action: "detach" });
  await first.orch.start();
  const a = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 })).id;
  const b = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 })).id;
  const p = (await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 })).id;
  await first.orch.pause(p);
  expect(await first.orch.close()).toEqual({ killed: 0, paused: 0, detached: 2, failed: 0 });
  expect(runtime.calls.filter((c) => c === "detach" || c.startsWith("kill:"))).toEqual(["detach"]);
  expect([a, b, p].map((id) => first.orch.store.get(id)!.state)).toEqual(["running", "running", "paused"]);
  await first.events.close();
  first.db.close();

  const second = node(home, runtime, clock);
  cleanup.push(() => second.db.close(), () => second.events.close(), () => second.orch.close());
  await second.orch.start();
  expect([a, b, p].map((id) => second.orch.get(id).state)).toEqual(["running", "running", "paused"]);
  expect(second.seen).toEqual([]);
  // the default action again: this node's shutdown kills what runs
  expect(await second.orch.close()).toEqual({ killed: 2, paused: 0, detached: 0, failed: 0 });
});
