/**
 * The reporter's event batching and shutdown order against a real scheduler on 127.0.0.1
 * (SQLite in memory, static discovery naming the node); the node is a plain snapshot source,
 * so no node process runs.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { SchedulerReporter, type ReporterOptions } from "../../src/node/reporter.ts";
import type { NodeIdentityInfo, SnapshotSource } from "../../src/observability/snapshot.ts";
import { startTestScheduler } from "../services/helpers.ts";
import { waitFor } from "../helpers/wait.ts";

const home = mkdtempSync("/tmp/aenv-report-ev-");
let sched: Awaited<ReturnType<typeof startTestScheduler>>;
beforeAll(async () => {
  sched = await startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__db_path: ":memory:", AENV__scheduler__nodes: "ev-a=http://127.0.0.1:1,ev-b=http://127.0.0.1:2" });
});
afterAll(async () => {
  await sched?.close();
  rmSync(home, { recursive: true, force: true });
});

const source: SnapshotSource = { counters: () => ({ running: 0, paused: 0, starting: 0, created: 0, failed: 0 }), sandboxes: () => [] };
const identity = (nodeId: string): NodeIdentityInfo => ({ nodeId, clusterId: "c", serviceInstanceId: `${nodeId}-1`, homePath: home, commit: "" });
const options = (o: Partial<ReporterOptions> = {}): ReporterOptions => ({ endpoint: `127.0.0.1:${sched.port}`, intervalMs: 3_600_000, timeoutMs: 5000, eventFlushMs: 0, eventBatchMax: 1000, ...o });

test("more events than one batch holds are all sent without waiting for another change", async () => {
  const r = new SchedulerReporter(identity("ev-a"), source, options({ eventBatchMax: 2 }));
  const calls: number[] = [];
  const orig = sched.core.reportEvents.bind(sched.core);
  sched.core.reportEvents = async (req) => {
    calls.push(req.events.length);
    return orig(req);
  };
  try {
    for (let i = 0; i < 5; i++) r.noteChange({ id: `batch${i}`, from: "creating", to: "running" });
    await waitFor("all five bindings", async () => (await sched.core.store.nodeBindings("ev-a")).length === 5);
    expect(await sched.core.store.nodeBindings("ev-a")).toEqual(["batch0", "batch1", "batch2", "batch3", "batch4"]);
    expect(calls).toEqual([2, 2, 1]);
  } finally {
    sched.core.reportEvents = orig;
    await r.close();
  }
});

test("close waits for the event call in flight, so the unregister comes after it and no binding survives", async () => {
  const r = new SchedulerReporter(identity("ev-b"), source, options());
  const orig = sched.core.reportEvents.bind(sched.core);
  let reached!: () => void;
  const atServer = new Promise<void>((res) => (reached = res));
  let release!: () => void;
  const gate = new Promise<void>((res) => (release = res));
  sched.core.reportEvents = async (req) => {
    reached();
    await gate;
    return orig(req);
  };
  try {
    r.noteChange({ id: "late1", from: "creating", to: "running" });
    await atServer; // the event call is at the scheduler, held there
    const closing = r.close();
    await Bun.sleep(50);
    release();
    await closing;
    expect(await sched.core.store.getBinding("late1")).toBeNull();
    expect((await sched.core.store.getReport("ev-b"))?.leftAtUnixMs).toBeGreaterThan(0);
  } finally {
    sched.core.reportEvents = orig;
    release();
  }
});
