/**
 * Sandbox expiry on one timer (src/orchestrator/expiry.ts over src/util/deadline-timer.ts),
 * driven by a fake clock (test/helpers/clock.ts) over a real SQLite file, with loopback guests
 * (test/helpers/loopback-runtime.ts) over the real VM runtime (its network manager not started):
 * one timer, armed at the earliest deadline of the running sandboxes and moved earlier when one
 * comes due sooner; it acts at the deadline and not a millisecond before, kills or (autoPause)
 * pauses, and is unset when nothing runs. No real time passes for the deadlines.
 */
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { openDb } from "../../src/db/index.ts";
import { Orchestrator, orchestratorConfig, type SandboxEvent, type SandboxState } from "../../src/orchestrator/index.ts";
import { FakeClock } from "../helpers/clock.ts";
import { LoopbackRuntime } from "../helpers/loopback-runtime.ts";
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
  const clock = new FakeClock();
  const orch = new Orchestrator(db, runtime, orchestratorConfig(cfg), clock);
  cleanup.push(() => rmSync(home, { recursive: true, force: true }), () => db.close(), () => orch.close());
  await orch.start();
  const events: SandboxEvent[] = [];
  orch.observe({ onEvent: (e) => events.push(e) });
  /** When sandbox `id` entered state `to` (unix ms on the clock). */
  const at = (id: string, to: SandboxState) => events.find((e) => e.id === id && e.to === to)?.at;
  /** Resolves when sandbox `id` reaches state `to`. */
  const reaches = (id: string, to: SandboxState) => new Promise<void>((r) => orch.observe({ onEvent: (e) => e.id === id && e.to === to && r() }));
  /** Move the clock on by `ms` and wait for the expiry timer's firing to settle. */
  const advance = async (ms: number) => {
    clock.advance(ms);
    await orch.expiry.idle();
  };
  return { orch, clock, runtime, reaches, at, advance };
}

test("one timer at the earliest deadline: moved earlier by a sooner one, fired at the deadline, unset when nothing runs", async () => {
  const { orch, clock, runtime, reaches, at, advance } = await world();
  const t0 = clock.now();
  const kills = () => runtime.calls.filter((c) => c.startsWith("kill:"));
  expect(clock.pending).toEqual([]);
  const a = (await orch.create({ template: "base", secure: true, timeoutSecs: 60 })).id;
  expect(clock.pending).toEqual([t0 + 60_000]);
  const b = (await orch.create({ template: "base", secure: true, timeoutSecs: 30 })).id;
  expect(clock.pending).toEqual([t0 + 30_000]); // one timer, moved earlier
  // b's deadline moves past a's: the timer stays; at 30 s it finds nothing due and moves on to a's
  await orch.refresh(b, 120);
  expect(clock.pending).toEqual([t0 + 30_000]);
  await advance(30_000);
  expect(clock.pending).toEqual([t0 + 60_000]);
  expect(kills()).toEqual([]);
  // a millisecond before a's deadline nothing happens
  await advance(29_999);
  expect([orch.store.get(a)!.state, orch.store.get(b)!.state]).toEqual(["running", "running"]);
  expect(kills()).toEqual([]);
  // at it, a is killed and the timer moves on to b
  const killedA = reaches(a, "killed");
  await advance(1);
  await killedA;
  expect(kills()).toEqual([`kill:${a}`]);
  expect(at(a, "killing")).toBe(t0 + 60_000);
  expect(clock.pending).toEqual([t0 + 120_000]);
  // setTimeout(0): due now
  const killedB = reaches(b, "killed");
  await orch.setTimeout(b, 0);
  expect(clock.pending).toEqual([t0 + 60_000]);
  await advance(0);
  await killedB;
  // nothing runs: no timer
  expect(clock.pending).toEqual([]);
  expect(kills()).toEqual([`kill:${a}`, `kill:${b}`]);
});

test("autoPause pauses at the deadline; a paused sandbox arms nothing until it runs again; close unsets the timer", async () => {
  const { orch, clock, runtime, reaches, advance } = await world();
  const t0 = clock.now();
  const c = (await orch.create({ template: "base", secure: true, timeoutSecs: 10, autoPause: true })).id;
  expect(clock.pending).toEqual([t0 + 10_000]);
  const paused = reaches(c, "paused");
  await advance(10_000);
  await paused;
  expect(runtime.calls.filter((x) => x.startsWith("pause:") || x.startsWith("kill:"))).toEqual([`pause:${c}`]);
  expect(clock.pending).toEqual([]);
  // connect resumes it with a new deadline
  await advance(5_000);
  await orch.connect(c, 20);
  expect(orch.store.get(c)!.state).toBe("running");
  expect(clock.pending).toEqual([t0 + 35_000]);
  await orch.close();
  expect(clock.pending).toEqual([]);
});
