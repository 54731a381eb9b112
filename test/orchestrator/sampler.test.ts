/**
 * The on-demand metrics sampler (`[metrics]` sample_interval_ms, watch_ms,
 * idle_sample_interval_ms, sample_timeout_ms, max_concurrent_samples) driven tick by tick with
 * a clock of its own: who is sampled when nobody looks, when someone reads (API: watched;
 * Prometheus: freshened only), how long a read waits, and how many samples run at once.
 */
import { expect, test } from "bun:test";
import pino from "pino";
import { MetricsHistory } from "../../src/orchestrator/metrics.ts";
import type { GuestTarget, RuntimeMetrics } from "../../src/orchestrator/runtime.ts";
import { MetricsSampler, type SamplerOptions } from "../../src/orchestrator/sampler.ts";

const OPTS: SamplerOptions = { intervalMs: 5000, watchMs: 60_000, idleIntervalMs: 0, timeoutMs: 2000, maxConcurrent: 16 };
const target = (id: string): GuestTarget => ({ id, endpoint: { host: "127.0.0.1", port: 1 }, envdAccessToken: null }) as unknown as GuestTarget;

/** A sampler over sandboxes `ids`, a clock the test moves, and a runtime that counts its samples per sandbox. */
function rig(ids: string[], opts: Partial<SamplerOptions> = {}, answer?: (id: string, signal: AbortSignal) => Promise<void>) {
  let t = 1_000_000;
  const calls: string[] = [];
  const runtime: RuntimeMetrics = {
    sample: async (x: GuestTarget, signal: AbortSignal) => {
      calls.push(x.id);
      await answer?.(x.id, signal);
      return { cpuCount: 1, cpuUsedPct: calls.length, memUsed: 1, memTotal: 2, memCache: 0, diskUsed: 3, diskTotal: 4 };
    },
  };
  const history = new MetricsHistory(100);
  const running = new Set(ids);
  const s = new MetricsSampler(runtime, history, () => [...running].map(target), { ...OPTS, ...opts }, () => t, pino({ level: "silent" }));
  const count = (id: string) => calls.filter((c) => c === id).length;
  return { s, history, running, calls, count, advance: (ms: number) => (t += ms) };
}

test("nobody reads: with idle_sample_interval_ms 0 no sandbox is ever sampled", async () => {
  const r = rig(["a", "b"]);
  for (let i = 0; i < 5; i++) {
    await r.s.sampleDue();
    r.advance(5000);
  }
  expect(r.calls).toEqual([]);
});

test("nobody reads: each sandbox is sampled once at its first tick, then every idle_sample_interval_ms", async () => {
  const r = rig(["a", "b"], { idleIntervalMs: 600_000 });
  await r.s.sampleDue();
  expect(r.calls.sort()).toEqual(["a", "b"]);
  // ticks every 5 s for almost 10 minutes: nothing more
  for (let i = 0; i < 119; i++) {
    r.advance(5000);
    await r.s.sampleDue();
  }
  expect(r.calls.length).toBe(2);
  r.advance(5000);
  await r.s.sampleDue();
  expect(r.count("a")).toBe(2);
  expect(r.count("b")).toBe(2);
});

test("a read through the API samples at once, then every sample_interval_ms for watch_ms; the others stay untouched", async () => {
  const r = rig(["a", "b"]);
  await r.s.watch(["a", "nosuch"], true);
  expect(r.calls).toEqual(["a"]);
  expect(r.history.latest("a")?.cpuUsedPct).toBe(1);
  expect(r.s.isWatched("a")).toBe(true);
  // a second read within the interval finds the sample current: no new one
  await r.s.watch(["a"], true);
  expect(r.calls).toEqual(["a"]);
  // watched for 60 s from the reads: the ticks at 5 ... 55 s sample it, the one at 60 s no
  // longer; b never
  for (let i = 0; i < 12; i++) {
    r.advance(5000);
    await r.s.sampleDue();
  }
  expect(r.count("a")).toBe(12);
  expect(r.count("b")).toBe(0);
  // then it is no longer watched
  for (let i = 0; i < 5; i++) {
    r.advance(5000);
    await r.s.sampleDue();
  }
  expect(r.s.isWatched("a")).toBe(false);
  expect(r.count("a")).toBe(12);
});

test("a Prometheus scrape (keep = false) takes current samples without watching", async () => {
  const r = rig(["a", "b", "c"]);
  await r.s.watch(["a", "b", "c"], false);
  expect(r.calls.sort()).toEqual(["a", "b", "c"]);
  expect(r.s.isWatched("a")).toBe(false);
  for (let i = 0; i < 4; i++) {
    r.advance(5000);
    await r.s.sampleDue();
  }
  expect(r.calls.length).toBe(3);
  // the next scrape, 20 s later: one sample each again
  await r.s.watch(["a", "b", "c"], false);
  expect(r.calls.length).toBe(6);
});

test("paused or killed sandboxes are not sampled; a killed one is forgotten", async () => {
  const r = rig(["a", "b"]);
  await r.s.watch(["a", "b"], true);
  r.running.delete("b"); // paused: no longer among the running
  r.advance(5000);
  await r.s.sampleDue();
  expect(r.count("a")).toBe(2);
  expect(r.count("b")).toBe(1);
  r.s.forget("a");
  expect(r.s.isWatched("a")).toBe(false);
  r.advance(5000);
  await r.s.sampleDue();
  expect(r.count("a")).toBe(2);
});

test("a read waits at most sample_timeout_ms; the late sample still lands in the history", async () => {
  let finish!: () => void;
  const late = new Promise<void>((res) => (finish = res));
  const r = rig(["slow"], { timeoutMs: 50 }, () => late);
  const t0 = performance.now();
  await r.s.watch(["slow"], true);
  expect(r.history.latest("slow")).toBeUndefined();
  expect(performance.now() - t0).toBeLessThan(5000); // returned on its bound, not on the sample
  finish();
  for (let i = 0; i < 100 && !r.history.latest("slow"); i++) await Bun.sleep(5);
  expect(r.history.latest("slow")).toBeDefined();
  // one sample in flight per sandbox: reads while it runs join it
  expect(r.calls).toEqual(["slow"]);
});

test("a sample that fails leaves no entry and is tried again at the next tick", async () => {
  let fail = true;
  const r = rig(["a"], {}, async () => {
    if (fail) throw new Error("envd busy");
  });
  await r.s.watch(["a"], true);
  expect(r.history.latest("a")).toBeUndefined();
  fail = false;
  r.advance(5000);
  await r.s.sampleDue();
  expect(r.history.latest("a")).toBeDefined();
  expect(r.calls).toEqual(["a", "a"]);
});

test("at most max_concurrent_samples samples run at once; a scrape of many queues behind them", async () => {
  let inFlight = 0;
  let peak = 0;
  const ids = Array.from({ length: 10 }, (_, i) => `s${i}`);
  const r = rig(ids, { maxConcurrent: 3 }, async () => {
    peak = Math.max(peak, ++inFlight);
    await Bun.sleep(5);
    inFlight--;
  });
  await r.s.watch(ids, false);
  expect(r.calls.length).toBe(10);
  expect(peak).toBe(3);
  expect(ids.every((id) => r.history.latest(id) !== undefined)).toBe(true);
});
