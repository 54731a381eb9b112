/**
 * The restore pool's bookkeeping (src/sandbox/restore-pool.ts) with a host that makes VMs as
 * plain records (the real host is the VM runtime; its VMs are exercised end to end in
 * test/e2e/restore-pool.test.ts): fills one at a time up to the high watermark, refills only
 * below the low one, claims and takes, claims that lapse, snapshots deleted or pushed out of the
 * pooled list, failed fills, VMs that die, the quiet gate, close. Orders and counts only.
 */
import { describe, expect, test } from "bun:test";
import { RestorePool, type RestorePoolHost, type RestorePoolOptions } from "../../src/sandbox/restore-pool.ts";
import { waitFor } from "../helpers/wait.ts";

interface Made {
  id: string;
  snapshot: string;
  ctx: string;
}

/** A host whose VMs are records; `events` lists fill/discard in order. */
function host(o: { failFills?: number } = {}) {
  const events: string[] = [];
  const live = new Map<string, Made>();
  const unusable = new Set<string>();
  let n = 0;
  let failFills = o.failFills ?? 0;
  let gate: Promise<void> = Promise.resolve();
  let openGate: () => void = () => {};
  const asked = { quiet: 0 };
  const h: RestorePoolHost<string> = {
    async fill(snapshot, ctx) {
      await Bun.sleep(1);
      if (failFills > 0) {
        failFills--;
        events.push(`fail ${snapshot}`);
        throw new Error("restore failed");
      }
      const id = `vm${++n}`;
      live.set(id, { id, snapshot, ctx });
      events.push(`fill ${snapshot} ${id}`);
      return id;
    },
    async discard(id, why) {
      live.delete(id);
      events.push(`discard ${id} (${why})`);
    },
    usable: (s) => !unusable.has(s),
    quiet: () => {
      asked.quiet++;
      return gate;
    },
  };
  return {
    h,
    events,
    live,
    unusable,
    /** How many times the pool waited for the host to be quiet (once before each fill). */
    asked,
    /** Hold fills back until `open()`. */
    close: () => (gate = new Promise<void>((r) => (openGate = r))),
    open: () => openGate(),
  };
}

const OPTS: RestorePoolOptions = { lowWatermark: 1, highWatermark: 2, snapshots: 1, claimTimeoutMs: 10_000, retryBackoffMs: 1, fillDelayMs: 0 };

describe("restore pool", () => {
  test("disabled (high watermark 0): nothing is made, nothing claimed", async () => {
    const x = host();
    const p = new RestorePool({ ...OPTS, lowWatermark: 0, highWatermark: 0 }, x.h);
    expect(p.enabled).toBe(false);
    p.want("s1", "c1");
    expect(p.claim("s1")).toBeNull();
    await p.close();
    // no fill loop ever ran: the host was never asked for anything
    expect([x.events, x.asked.quiet]).toEqual([[], 0]);
  });

  test("a wanted snapshot is filled one VM at a time to the high watermark; refilled only below the low one", async () => {
    const x = host();
    const p = new RestorePool(OPTS, x.h);
    expect(p.claim("s1")).toBeNull(); // nothing wanted yet
    p.want("s1", "ctx-a");
    await waitFor("two ready", () => p.counts("s1").ready === 2);
    expect(x.events).toEqual(["fill s1 vm1", "fill s1 vm2"]);
    expect([...x.live.values()].map((m) => m.ctx)).toEqual(["ctx-a", "ctx-a"]);
    // one claimed and taken: one ready left, not below the low watermark: no fill
    const a = p.claim("s1")!;
    expect(p.counts("s1")).toEqual({ ready: 1, claimed: 1, filling: 0 });
    expect(p.take(a)).toBe("s1");
    expect(p.take(a)).toBeNull(); // taken once
    // (no fill for that one: the events below list exactly the refill the second take causes)
    // the second taken: below low, filled back to high
    const b = p.claim("s1")!;
    expect(b).not.toBe(a);
    expect(p.take(b)).toBe("s1");
    await waitFor("refilled", () => p.counts("s1").ready === 2);
    expect(x.events).toEqual(["fill s1 vm1", "fill s1 vm2", "fill s1 vm3", "fill s1 vm4"]);
    expect(p.counters).toMatchObject({ filled: 4, taken: 2, discarded: 0, failed: 0 });
    // an unclaimed id is not taken
    expect(p.take("vm3")).toBeNull();
    expect(p.has("vm3")).toBe(true);
    await p.close();
    expect(x.events.slice(4).sort()).toEqual(["discard vm3 (pool closed)", "discard vm4 (pool closed)"]);
    expect(x.live.size).toBe(2); // vm1, vm2: handed to their creates, not the pool's any more
  });

  test("a claim not started in time lapses: the VM is discarded and cannot be taken", async () => {
    let now = 0;
    const x = host();
    const p = new RestorePool({ ...OPTS, highWatermark: 1, lowWatermark: 1 }, x.h, () => now);
    p.want("s1", "c");
    await waitFor("ready", () => p.counts("s1").ready === 1);
    const id = p.claim("s1")!;
    now += 9_999;
    await p.sweep();
    expect(p.has(id)).toBe(true);
    now += 2;
    await p.sweep();
    expect(p.has(id)).toBe(false);
    expect(p.take(id)).toBeNull();
    expect(x.events).toContain(`discard ${id} (claim not started in time)`);
    await p.close();
  });

  test("a deleted or replaced snapshot loses its VMs and its place; only `snapshots` snapshots are pooled", async () => {
    const x = host();
    const p = new RestorePool(OPTS, x.h);
    p.want("s1", "c1");
    await waitFor("s1 full", () => p.counts("s1").ready === 2);
    // a second snapshot pushes the first out (snapshots = 1): its ready VMs go, s2 is filled
    p.want("s2", "c2");
    await waitFor("s2 full", () => p.counts("s2").ready === 2);
    expect(p.pooledSnapshots()).toEqual(["s2"]);
    expect(x.events.slice(0, 4)).toEqual(["fill s1 vm1", "fill s1 vm2", "discard vm1 (snapshot no longer pooled)", "discard vm2 (snapshot no longer pooled)"]);
    expect(p.counts("s1").ready).toBe(0);
    // s2 deleted: swept, not refilled
    x.unusable.add("s2");
    p.poke();
    await waitFor("s2 emptied", () => p.counts("s2").ready === 0);
    expect(p.pooledSnapshots()).toEqual([]);
    expect(p.claim("s2")).toBeNull();
    await p.close();
    // the loop has ended: it never filled s2 again
    expect(x.events.filter((e) => e.startsWith("fill s2")).length).toBe(2);
    expect(x.live.size).toBe(0);
  });

  test("a failed fill is counted and tried again after the backoff", async () => {
    const x = host({ failFills: 2 });
    const p = new RestorePool({ ...OPTS, highWatermark: 1 }, x.h);
    p.want("s1", "c");
    await waitFor("ready", () => p.counts("s1").ready === 1);
    expect(x.events).toEqual(["fail s1", "fail s1", "fill s1 vm1"]);
    expect(p.counters.failed).toBe(2);
    await p.close();
  });

  test("a VM that dies while pooled is dropped and replaced", async () => {
    const x = host();
    const p = new RestorePool({ ...OPTS, highWatermark: 1 }, x.h);
    p.want("s1", "c");
    await waitFor("ready", () => p.counts("s1").ready === 1);
    p.lost("vm1");
    await waitFor("replaced", () => p.has("vm2"));
    expect(x.events).toEqual(["fill s1 vm1", "discard vm1 (VM exited while pooled)", "fill s1 vm2"]);
    await p.close();
  });

  test("fills wait for the host's quiet gate; a fill that ends after close is discarded", async () => {
    const x = host();
    x.close();
    const p = new RestorePool(OPTS, x.h);
    p.want("s1", "c");
    await waitFor("the pool to wait for the host to be quiet", () => x.asked.quiet === 1);
    expect(x.events).toEqual([]); // not quiet: nothing made
    expect(p.counts("s1")).toEqual({ ready: 0, claimed: 0, filling: 0 });
    x.open();
    await waitFor("one ready", () => p.counts("s1").ready >= 1);
    await p.close();
    expect(x.live.size).toBe(0);
    expect(x.events.filter((e) => e.startsWith("discard")).length).toBe(x.events.filter((e) => e.startsWith("fill")).length);
  });
});
