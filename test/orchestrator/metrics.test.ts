/**
 * The per-sandbox metrics history (`[metrics] history_samples`): a ring that keeps the newest
 * `capacity` samples of each sandbox, read oldest first, through and past its wrap point.
 */
import { expect, test } from "bun:test";
import { MetricsHistory } from "../../src/orchestrator/metrics.ts";
import type { SandboxMetricsSample } from "../../src/orchestrator/types.ts";

/** A sample taken at `at` ms whose cpuUsedPct is `at` too, so order and identity show in one field. */
const sample = (at: number): SandboxMetricsSample => ({ at, cpuCount: 2, cpuUsedPct: at, memUsed: 1, memTotal: 2, memCache: 0, diskUsed: 3, diskTotal: 4 });
const ats = (s: SandboxMetricsSample[]) => s.map((x) => x.at);

test("the history keeps the newest history_samples samples per sandbox, oldest first, across every wrap", () => {
  const h = new MetricsHistory(3);
  expect(h.range("a")).toEqual([]);
  expect(h.latest("a")).toBeUndefined();
  const seen: number[][] = [];
  const latest: (number | undefined)[] = [];
  for (let i = 1; i <= 8; i++) {
    h.add("a", sample(i));
    seen.push(ats(h.range("a")));
    latest.push(h.latest("a")?.at);
  }
  expect(seen).toEqual([[1], [1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6], [5, 6, 7], [6, 7, 8]]);
  expect(latest).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
  // the same objects come back, not copies with other values
  expect(h.range("a").map((s) => s.cpuUsedPct)).toEqual([6, 7, 8]);
  // an interval over a wrapped ring: inclusive bounds, open ends
  expect(ats(h.range("a", 7))).toEqual([7, 8]);
  expect(ats(h.range("a", undefined, 6))).toEqual([6]);
  expect(ats(h.range("a", 7, 7))).toEqual([7]);
  expect(ats(h.range("a", 1, 5))).toEqual([]); // dropped by the bound, not by the filter
  expect(ats(h.range("a", 9))).toEqual([]);
});

test("each sandbox has its own ring; drop forgets one; a capacity of 1 keeps only the newest", () => {
  const h = new MetricsHistory(2);
  for (let i = 1; i <= 5; i++) h.add("a", sample(i));
  h.add("b", sample(100));
  expect(ats(h.range("a"))).toEqual([4, 5]);
  expect(ats(h.range("b"))).toEqual([100]);
  expect(h.ids().sort()).toEqual(["a", "b"]);
  h.drop("a");
  expect(h.range("a")).toEqual([]);
  expect(h.latest("a")).toBeUndefined();
  expect(h.ids()).toEqual(["b"]);
  // a dropped sandbox starts a fresh ring
  h.add("a", sample(7));
  expect(ats(h.range("a"))).toEqual([7]);

  const one = new MetricsHistory(1);
  const got: number[][] = [];
  for (let i = 1; i <= 3; i++) {
    one.add("x", sample(i));
    got.push(ats(one.range("x")));
  }
  expect(got).toEqual([[1], [2], [3]]);
  expect(one.latest("x")?.at).toBe(3);
});

test("a long run stays at the bound: 10 000 samples into a ring of 720 leave the last 720, in order", () => {
  const h = new MetricsHistory(720);
  for (let i = 0; i < 10_000; i++) h.add("a", sample(i));
  const r = ats(h.range("a"));
  expect(r.length).toBe(720);
  expect(r[0]).toBe(10_000 - 720);
  expect(r.at(-1)).toBe(9_999);
  expect(r.every((v, i) => i === 0 || v === r[i - 1]! + 1)).toBe(true);
});
