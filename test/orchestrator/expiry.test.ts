/**
 * Sandbox expiry on one timer (src/orchestrator/expiry.ts), driven by a manual clock over a real
 * SQLite file, with loopback guests (test/helpers/loopback-runtime.ts) over the real VM runtime
 * (its network manager not started): the timer is armed at the earliest deadline of the running
 * sandboxes and nowhere else, moves when a deadline or a state changes, acts at the deadline
 * and not a millisecond before, kills or (autoPause) pauses, and is disarmed when nothing runs.
 */
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { openDb } from "../../src/db/index.ts";
import { Orchestrator, orchestratorConfig, type SandboxEvent, type SandboxState } from "../../src/orchestrator/index.ts";
import { LoopbackRuntime } from "../helpers/loopback-runtime.ts";
import { ManualClock } from "../helpers/manual-clock.ts";
import { idleVmRuntime } from "../helpers/vm-runtime.ts";

const cleanup: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

async function world() {
  const home = mkdtempSync(join(tmpdir(), "orch-expiry-"));
  const cfg = loadConfig({ env: { AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run") } });
  const db = openDb(join(home, "node.db"));
  const runtime = new LoopbackRuntime({ base: idleVmRuntime(cfg, db).runtime });
  const clock = new ManualClock();
  const orch = new Orchestrator(db, runtime, orchestratorConfig(cfg), clock);
  cleanup.push(() => rmSync(home, { recursive: true, force: true }), () => db.close(), () => orch.close());
  await orch.start();
  const events: SandboxEvent[] = [];
  orch.observe({ onEvent: (e) => events.push(e) });
  /** When sandbox `id` entered state `to` (unix ms on the clock). */
  const at = (id: string, to: SandboxState) => events.find((e) => e.id === id && e.to === to)?.at;
  /** Resolves when sandbox `id` reaches state `to`. */
  const reaches = (id: string, to: SandboxState) => new Promise<void>((r) => orch.observe({ onEvent: (e) => e.id === id && e.to === to && r() }));
  return { orch, clock, runtime, reaches, at };
}

test("one timer at the earliest deadline: moved by refresh and setTimeout, fired at the deadline, gone when nothing runs", async () => {
  const { orch, clock, runtime, reaches, at } = await world();
  const t0 = clock.now();
  expect(clock.armed()).toEqual([]);
  const a = (await orch.create({ template: "base", secure: true, timeoutSecs: 60 })).id;
  expect(clock.armed()).toEqual([t0 + 60_000]);
  const b = (await orch.create({ template: "base", secure: true, timeoutSecs: 30 })).id;
  expect(clock.armed()).toEqual([t0 + 30_000]);
  // b's deadline moves past a's: the timer follows the earliest
  await orch.refresh(b, 120);
  expect(clock.armed()).toEqual([t0 + 60_000]);
  // a millisecond before a's deadline nothing happens
  clock.advance(59_999);
  expect([orch.store.get(a)!.state, orch.store.get(b)!.state]).toEqual(["running", "running"]);
  expect(runtime.calls.filter((c) => c.startsWith("kill:"))).toEqual([]);
  // at it, a is killed and the timer moves on to b
  const killedA = reaches(a, "killed");
  clock.advance(1);
  await killedA;
  expect(runtime.calls.filter((c) => c.startsWith("kill:"))).toEqual([`kill:${a}`]);
  expect(at(a, "killing")).toBe(t0 + 60_000);
  expect(clock.armed()).toEqual([t0 + 120_000]);
  // setTimeout(0): due now
  const killedB = reaches(b, "killed");
  await orch.setTimeout(b, 0);
  expect(clock.armed()).toEqual([t0 + 60_000]);
  clock.advance(0);
  await killedB;
  // nothing runs: no timer
  expect(clock.armed()).toEqual([]);
  expect(orch.store.get(b)!.state).toBe("killed");
});

test("autoPause pauses at the deadline; a paused sandbox arms nothing until it runs again", async () => {
  const { orch, clock, runtime, reaches } = await world();
  const t0 = clock.now();
  const c = (await orch.create({ template: "base", secure: true, timeoutSecs: 10, autoPause: true })).id;
  expect(clock.armed()).toEqual([t0 + 10_000]);
  const paused = reaches(c, "paused");
  clock.advance(10_000);
  await paused;
  expect(runtime.calls.filter((x) => x.startsWith("pause:") || x.startsWith("kill:"))).toEqual([`pause:${c}`]);
  expect(clock.armed()).toEqual([]);
  // connect resumes it with a new deadline
  clock.advance(5_000);
  await orch.connect(c, 20);
  expect(orch.store.get(c)!.state).toBe("running");
  expect(clock.armed()).toEqual([t0 + 35_000]);
  // close disarms it
  await orch.close();
  expect(clock.armed()).toEqual([]);
});
