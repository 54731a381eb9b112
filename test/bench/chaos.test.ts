// The chaos bench's pure pieces (bench/chaos/plan.ts): the seeded kill schedule, the ledger of
// written files and what a check may find in them, the leak tally, percentiles.
import { describe, expect, test } from "bun:test";
import { FileLedger, killSchedule, leakCounts, percentile, type Leftovers, type ScheduleOptions } from "../../bench/chaos/plan.ts";
import { rng } from "../helpers/fuzz.ts";

const opts: ScheduleOptions = { seed: 42, kills: 200, minGapMs: 1000, maxGapMs: 5000, weights: { node: 2, daemon: 1, vmm: 2 }, daemonKillsPerNode: 2 };

describe("rng (the seeded source the chaos bench replays --seed with)", () => {
  test("the same seed gives the same sequence, another seed another one, all in [0, 1)", () => {
    const take = (seed: number) => {
      const r = rng(seed);
      return Array.from({ length: 1000 }, () => r());
    };
    expect(take(7)).toEqual(take(7));
    expect(take(7)).not.toEqual(take(8));
    const xs = take(7);
    expect(xs.every((x) => x >= 0 && x < 1)).toBe(true);
    // spread over the range, not stuck in a corner
    expect(xs.filter((x) => x < 0.5).length).toBeGreaterThan(400);
    expect(xs.filter((x) => x < 0.5).length).toBeLessThan(600);
  });
});

describe("killSchedule", () => {
  test("is replayable from its seed, with gaps inside the bounds and every kind drawn", () => {
    const s = killSchedule(opts);
    expect(killSchedule(opts)).toEqual(s);
    expect(killSchedule({ ...opts, seed: 43 })).not.toEqual(s);
    expect(s).toHaveLength(200);
    expect(s.every((k) => k.gapMs >= 1000 && k.gapMs <= 5000 && k.pick >= 0 && k.pick < 1)).toBe(true);
    for (const kind of ["node", "daemon", "vmm"] as const) expect(s.filter((k) => k.kind === kind).length).toBeGreaterThan(10);
  });

  test("never more daemon kills in a row than the node restarts its daemon, without a node kill between", () => {
    const s = killSchedule({ ...opts, weights: { node: 1, daemon: 20, vmm: 1 } });
    let run = 0;
    let most = 0;
    for (const k of s) {
      run = k.kind === "node" ? 0 : k.kind === "daemon" ? run + 1 : run;
      most = Math.max(most, run);
    }
    expect(most).toBe(2);
  });

  test("a kind of weight 0 is never drawn; zero kills is an empty schedule", () => {
    expect(killSchedule({ ...opts, weights: { node: 1, daemon: 0, vmm: 1 } }).some((k) => k.kind === "daemon")).toBe(false);
    expect(killSchedule({ ...opts, kills: 0 })).toEqual([]);
  });

  test("bad bounds and all-zero weights are refused", () => {
    expect(() => killSchedule({ ...opts, minGapMs: 5, maxGapMs: 4 })).toThrow(RangeError);
    expect(() => killSchedule({ ...opts, kills: -1 })).toThrow(RangeError);
    expect(() => killSchedule({ ...opts, weights: { node: 0, daemon: 0, vmm: 0 } })).toThrow(RangeError);
  });
});

describe("FileLedger", () => {
  const v = (sha: string, size: number) => ({ sha256: sha, size });

  test("the acknowledged version is fine; anything else loses its bytes, counted once", () => {
    const l = new FileLedger();
    l.acked("/a", v("aa", 100));
    l.acked("/a", v("ab", 300));
    expect(l.ackedBytes()).toBe(300);
    expect(l.observe("/a", v("ab", 300))).toEqual({ ok: true, bytesLost: 0, wrong: false });
    // the older version came back: the acknowledged one is lost
    l.acked("/a", v("ac", 50), 1234);
    expect(l.observe("/a", v("ab", 300))).toEqual({ ok: false, bytesLost: 50, wrong: true, found: "older", ackedAt: 1234 });
    // the ledger took what it saw: the same content again is no new loss
    expect(l.observe("/a", v("ab", 300))).toEqual({ ok: true, bytesLost: 0, wrong: false });
  });

  test("a file gone loses its acknowledged bytes once; it must stay gone, and a version of it coming back is an older one", () => {
    const l = new FileLedger();
    l.acked("/b", v("bb", 1234), 99);
    expect(l.observe("/b", null)).toEqual({ ok: false, bytesLost: 1234, wrong: false, found: "absent", ackedAt: 99 });
    expect(l.paths()).toEqual(["/b"]);
    expect(l.observe("/b", null)).toEqual({ ok: true, bytesLost: 0, wrong: false });
    expect(l.observe("/b", v("bb", 1234))).toMatchObject({ ok: false, bytesLost: 0, wrong: true, found: "older" });
  });

  test("a version seen at an earlier check that comes back later is an older one, not foreign", () => {
    const l = new FileLedger();
    l.acked("/g", v("g1", 1));
    expect(l.observe("/g", v("g1", 1)).ok).toBe(true);
    l.acked("/g", v("g2", 2));
    expect(l.observe("/g", v("g2", 2)).ok).toBe(true);
    l.acked("/g", v("g3", 3));
    expect(l.observe("/g", v("g1", 1))).toMatchObject({ ok: false, bytesLost: 3, found: "older" });
  });

  test("a write whose answer was cut may or may not have landed, never half", () => {
    const l = new FileLedger();
    l.acked("/c", v("c1", 10));
    l.cut("/c", v("c2", 20));
    expect(l.observe("/c", v("c1", 10)).ok).toBe(true);
    l.cut("/c", v("c3", 30));
    expect(l.observe("/c", v("c3", 30)).ok).toBe(true);
    expect(l.ackedBytes()).toBe(30);
    // a cut first write of a new file: absent or whole
    l.cut("/d", v("d1", 40));
    expect(l.observe("/d", null)).toEqual({ ok: true, bytesLost: 0, wrong: false });
    l.cut("/e", v("e1", 40));
    expect(l.observe("/e", v("torn", 17))).toEqual({ ok: false, bytesLost: 0, wrong: true, found: "foreign", ackedAt: 0 });
  });

  test("a copy (a fork child's, a snapshot's) is judged apart from its original", () => {
    const l = new FileLedger();
    l.acked("/f", v("f1", 5));
    l.cut("/f", v("f2", 6));
    const c = l.copy();
    expect(c.observe("/f", v("f2", 6)).ok).toBe(true);
    expect(l.observe("/f", v("f1", 5)).ok).toBe(true);
    expect(c.paths()).toEqual(["/f"]);
  });

  test("observing a path never written is a bug of the caller", () => {
    expect(() => new FileLedger().observe("/nowhere", null)).toThrow(RangeError);
  });
});

test("leakCounts counts each kind and their total", () => {
  const none: Leftovers = { vmms: [], diskDaemons: [], netns: [], mounts: [], loopDevices: [], ublkDevices: [], workDirs: [], layers: [], staging: [], vmmRecords: [] };
  expect(leakCounts(none).total).toBe(0);
  const c = leakCounts({ ...none, vmms: [12, 13], netns: ["ae1-s0"], layers: ["ab"] });
  expect(c).toMatchObject({ vmms: 2, netns: 1, layers: 1, mounts: 0, total: 4 });
});

test("percentile takes the nearest rank; none of nothing", () => {
  expect(percentile([4, 1, 3, 2], 50)).toBe(2);
  expect(percentile([4, 1, 3, 2], 95)).toBe(4);
  expect(percentile([7], 0)).toBe(7);
  expect(percentile([], 50)).toBeNull();
});
