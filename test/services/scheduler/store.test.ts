/**
 * The same store contract against both implementations: SQLite (a temp file, reopened) and
 * Redis (Debian's redis-server started by this test on 127.0.0.1, killed by pid after).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { NodeStatus } from "../../../src/cluster/index.ts";
import { RedisStore, SchedulerCore, SqliteStore, StaticDiscovery, type SchedulerStore } from "../../../services/scheduler/index.ts";
import { FakeClock } from "../../helpers/clock.ts";
import { RedisClient } from "bun";
import { openDb } from "../../../src/db/index.ts";
import { SCHEDULER_MIGRATIONS } from "../../../services/scheduler/store/migrations/index.ts";
import { beat, startRedis, type TestRedis } from "../helpers.ts";

let redis: TestRedis;
const dir = mkdtempSync("/tmp/aenv-sched-store-");
beforeAll(async () => {
  redis = await startRedis();
});
afterAll(async () => {
  await redis?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const kinds: [string, () => SchedulerStore][] = [
  ["sqlite", () => new SqliteStore(join(dir, "s.db"))],
  ["redis", () => new RedisStore(redis.url, `t${Math.random().toString(36).slice(2, 8)}:`, 3000)],
];

const report = (nodeId: string, lastSeen: number, leftAtUnixMs: number | null = null) => ({
  node: {
    nodeId,
    endpoint: `http://${nodeId}:8000`,
    clusterId: "c",
    serviceInstanceId: "i",
    version: "v",
    commit: "",
    machineInfo: undefined,
    snapshot: { status: NodeStatus.NODE_STATUS_READY, allocatedCpu: 2, allocatedMemoryBytes: 2 ** 33, cpuPercent: 1, cpuCount: 2, memoryUsedBytes: 1, memoryTotalBytes: 2 ** 34, disks: [{ mountPoint: "/", device: "sda", filesystemType: "ext4", usedBytes: 5, totalBytes: 10 }], sandboxCount: 1, sandboxStartingCount: 0, createSuccesses: 9, createFails: 1, reportedAtUnixMs: lastSeen, pausedSandboxCount: 0, pausedAllocatedCpu: 0, pausedAllocatedMemoryBytes: 0 },
    lastSeenUnixMs: lastSeen,
  },
  p2p: nodeId === "a" ? { backend: "iroh", address: "x" } : null,
  leftAtUnixMs,
});

for (const [kind, make] of kinds) {
  describe(kind, () => {
    test("bindings: put, move, delete (node-guarded), roster reconcile, node drop, count", async () => {
      const s = make();
      try {
        await s.putBinding({ sandboxId: "s1", nodeId: "a", endpoint: "http://a:8000", updatedAt: 100, held: true });
        await s.putBinding({ sandboxId: "s2", nodeId: "a", endpoint: "http://a:8000", updatedAt: 100, held: true });
        await s.putBinding({ sandboxId: "s3", nodeId: "b", endpoint: "http://b:8000", updatedAt: 100, held: false });
        expect(await s.getBinding("s1")).toEqual({ sandboxId: "s1", nodeId: "a", endpoint: "http://a:8000", updatedAt: 100, held: true });
        expect(await s.getBinding("zz")).toBeNull();
        // move s2 to b (recorded by the gateway: not held there yet)
        await s.putBinding({ sandboxId: "s2", nodeId: "b", endpoint: "http://b:8000", updatedAt: 200, held: false });
        expect(await s.getBinding("s2")).toMatchObject({ nodeId: "b", held: false });
        expect(await s.nodeBindings("a")).toEqual(["s1"]);
        expect(await s.nodeBindings("b")).toEqual(["s2", "s3"]);
        expect(await s.deleteBinding("s3", "a")).toBe(false);
        expect(await s.deleteBinding("s3", "b")).toBe(true);
        expect(await s.deleteBinding("s3")).toBe(false);
        expect(await s.countBindings()).toBe(2);
        // roster of a: s1 missing (old → dropped), s4 new, s2 stays on b (not a's to take)
        await s.putBinding({ sandboxId: "s5", nodeId: "a", endpoint: "http://a:8000", updatedAt: 900, held: true });
        expect(await s.reconcileRoster("a", "http://a:8001", ["s2", "s4"], 1000, 500)).toEqual({ added: 1, removed: 1, foreign: [] });
        expect(await s.nodeBindings("a")).toEqual(["s4", "s5"]);
        expect(await s.nodeBindings("b")).toEqual(["s2"]);
        expect(await s.getBinding("s4")).toEqual({ sandboxId: "s4", nodeId: "a", endpoint: "http://a:8001", updatedAt: 1000, held: true });
        expect(await s.getBinding("s5")).toMatchObject({ updatedAt: 900 });
        // b's roster confirms s2: held there; a's next roster listing it is told it is foreign
        expect(await s.reconcileRoster("b", "http://b:8000", ["s2"], 1100, 1100)).toEqual({ added: 0, removed: 0, foreign: [] });
        expect(await s.getBinding("s2")).toMatchObject({ nodeId: "b", held: true, updatedAt: 1100 });
        expect(await s.reconcileRoster("a", "http://a:8001", ["s2", "s4", "s5"], 1200, 1200)).toEqual({ added: 0, removed: 0, foreign: ["s2"] });
        expect(await s.getBinding("s2")).toMatchObject({ nodeId: "b", updatedAt: 1100 });
        // an empty roster drops everything older
        expect(await s.reconcileRoster("a", "http://a:8001", [], 2000, 2000)).toEqual({ added: 0, removed: 2, foreign: [] });
        await s.reconcileRoster("a", "http://a:8001", ["s6", "s7"], 3000, 3000);
        expect(await s.dropNodeBindings("a")).toBe(2);
        expect(await s.dropNodeBindings("b")).toBe(1);
        expect(await s.countBindings()).toBe(0);
      } finally {
        await s.close();
      }
    });

    test("held: kept by a put on the same node, never taken by a claim from another node; moves are compare-and-set", async () => {
      const s = make();
      try {
        await s.putBinding({ sandboxId: "h1", nodeId: "a", endpoint: "http://a:8000", updatedAt: 10, held: true });
        // a RecordAssignment after the node's own event keeps it held
        await s.putBinding({ sandboxId: "h1", nodeId: "a", endpoint: "http://a:8000", updatedAt: 20, held: false });
        expect(await s.getBinding("h1")).toMatchObject({ nodeId: "a", held: true, updatedAt: 20 });
        expect(await s.claimBinding({ sandboxId: "h1", nodeId: "b", endpoint: "http://b:8000", updatedAt: 30, held: true })).toBe(false);
        expect(await s.getBinding("h1")).toMatchObject({ nodeId: "a", updatedAt: 20 });
        // a binding not held (recorded, not yet confirmed) is claimed by the node that reports it
        await s.putBinding({ sandboxId: "h2", nodeId: "a", endpoint: "http://a:8000", updatedAt: 10, held: false });
        expect(await s.claimBinding({ sandboxId: "h2", nodeId: "b", endpoint: "http://b:8000", updatedAt: 40, held: true })).toBe(true);
        expect(await s.getBinding("h2")).toEqual({ sandboxId: "h2", nodeId: "b", endpoint: "http://b:8000", updatedAt: 40, held: true });
        expect(await s.claimBinding({ sandboxId: "h3", nodeId: "b", endpoint: "http://b:8000", updatedAt: 40, held: true })).toBe(true);
        // move: only while the binding names the given node
        expect(await s.moveBinding("b", { sandboxId: "h1", nodeId: "c", endpoint: "http://c:8000", updatedAt: 50, held: false })).toMatchObject({ nodeId: "a", updatedAt: 20 });
        expect(await s.moveBinding("a", { sandboxId: "h1", nodeId: "c", endpoint: "http://c:8000", updatedAt: 50, held: false })).toEqual({ sandboxId: "h1", nodeId: "c", endpoint: "http://c:8000", updatedAt: 50, held: false });
        expect(await s.moveBinding("a", { sandboxId: "h1", nodeId: "b", endpoint: "http://b:8000", updatedAt: 60, held: false })).toMatchObject({ nodeId: "c" });
        expect(await s.moveBinding("a", { sandboxId: "none", nodeId: "b", endpoint: "http://b:8000", updatedAt: 60, held: false })).toBeNull();
        expect(await s.getBinding("none")).toBeNull();
        expect(await s.nodeBindings("a")).toEqual([]);
        expect(await s.nodeBindings("b")).toEqual(["h2", "h3"]);
        expect(await s.nodeBindings("c")).toEqual(["h1"]);
        for (const n of ["a", "b", "c"]) await s.dropNodeBindings(n);
      } finally {
        await s.close();
      }
    });

    test("a roster of 5,000 ids in one reconcile", async () => {
      const s = make();
      try {
        const ids = Array.from({ length: 5000 }, (_, i) => `big${i}`);
        expect(await s.reconcileRoster("big", "http://big:8000", ids, 10, 10)).toEqual({ added: 5000, removed: 0, foreign: [] });
        expect(await s.reconcileRoster("big", "http://big:8000", ids.slice(1), 20, 20)).toEqual({ added: 0, removed: 1, foreign: [] });
        expect((await s.nodeBindings("big")).length).toBe(4999);
        await s.dropNodeBindings("big");
      } finally {
        await s.close();
      }
    });

    test("node reports round-trip (numbers, nested snapshot, p2p) and are listed by id", async () => {
      const s = make();
      try {
        await s.putReport(report("b", 5));
        await s.putReport(report("a", 7));
        await s.putReport(report("a", 8));
        const all = await s.listReports();
        expect(all.map((r) => [r.node.nodeId, r.node.lastSeenUnixMs])).toEqual([
          ["a", 8],
          ["b", 5],
        ]);
        expect(all[0]).toEqual(report("a", 8));
        expect(await s.getReport("b")).toEqual(report("b", 5));
        // an unregistered node's report keeps its mark until the next report clears it
        await s.putReport(report("b", 6, 1234));
        expect(await s.getReport("b")).toEqual(report("b", 6, 1234));
        await s.putReport(report("b", 7));
        expect((await s.getReport("b"))!.leftAtUnixMs).toBeNull();
        await s.deleteReport("a");
        expect(await s.getReport("a")).toBeNull();
        await s.deleteReport("b");
      } finally {
        await s.close();
      }
    });
  });
}

test("sqlite: bindings survive closing and reopening the file", async () => {
  const path = join(dir, "persist.db");
  const a = new SqliteStore(path);
  await a.putBinding({ sandboxId: "keep", nodeId: "n", endpoint: "http://n:1", updatedAt: 42, held: false });
  await a.close();
  const b = new SqliteStore(path);
  expect(await b.getBinding("keep")).toEqual({ sandboxId: "keep", nodeId: "n", endpoint: "http://n:1", updatedAt: 42, held: false });
  await b.close();
});

test("sqlite: a database of the first schema is migrated; its reports read as not left, its bindings as held", async () => {
  const path = join(dir, "v1.db");
  const v1 = openDb(path, SCHEDULER_MIGRATIONS.slice(0, 1));
  v1.sqlite.query("INSERT INTO node_reports (node_id, node, p2p, last_seen) VALUES (?, ?, NULL, ?)").run("old", JSON.stringify({ nodeId: "old", lastSeenUnixMs: 5 }), 5);
  v1.sqlite.query("INSERT INTO bindings (sandbox_id, node_id, endpoint, updated_at) VALUES (?, ?, ?, ?)").run("b1", "old", "http://old:1", 5);
  v1.close();
  const s = new SqliteStore(path);
  try {
    expect(await s.getReport("old")).toMatchObject({ node: { nodeId: "old", lastSeenUnixMs: 5 }, p2p: null, leftAtUnixMs: null });
    expect(await s.getBinding("b1")).toEqual({ sandboxId: "b1", nodeId: "old", endpoint: "http://old:1", updatedAt: 5, held: true });
  } finally {
    await s.close();
  }
});

test("redis: a corrupt binding or report is a store_failed error, not a crash", async () => {
  const prefix = "corrupt:";
  const raw = new RedisClient(redis.url);
  const s = new RedisStore(redis.url, prefix, 3000);
  try {
    await raw.set(prefix + "b:broken", "{not json");
    // written before `h` existed: held
    await raw.set(prefix + "b:older", JSON.stringify({ n: "a", e: "http://a:1", t: 7 }));
    expect(await s.getBinding("older")).toEqual({ sandboxId: "older", nodeId: "a", endpoint: "http://a:1", updatedAt: 7, held: true });
    await raw.set(prefix + "b:halfway", JSON.stringify({ n: "a" }));
    await raw.hset(prefix + "reports", { x: "[1," });
    await expect(s.getBinding("broken")).rejects.toMatchObject({ code: "scheduler.store_failed", message: expect.stringContaining("lookup failed") });
    await expect(s.getBinding("halfway")).rejects.toMatchObject({ code: "scheduler.store_failed", message: expect.stringContaining("corrupt binding of halfway") });
    await expect(s.getReport("x")).rejects.toMatchObject({ code: "scheduler.store_failed" });
    await expect(s.listReports()).rejects.toMatchObject({ code: "scheduler.store_failed" });
  } finally {
    raw.close();
    await s.close();
  }
});

test("redis: an unreachable server is a store_failed error naming it (password redacted)", async () => {
  const s = new RedisStore("redis://u:secret@127.0.0.1:1", "x:", 3000);
  try {
    const e = await s.ping().then(
      () => null,
      (err) => err,
    );
    expect(e).toMatchObject({ code: "scheduler.store_failed" });
    expect(e.message).toContain("redis://u:***@127.0.0.1:1");
    expect(e.message).not.toContain("secret");
  } finally {
    await s.close();
  }
});

test("redis (shared by replicas): report expiry scans at least every report_ttl, so a report another replica wrote is handled when it runs out", async () => {
  const clock = new FakeClock(5_000_000);
  const prefix = `exp${Math.random().toString(36).slice(2, 8)}:`;
  const mine = new RedisStore(redis.url, prefix, 3000);
  const other = new RedisStore(redis.url, prefix, 3000);
  const o = { strategy: "round_robin" as const, bindingTtlMs: 30_000, reportTtlMs: 10_000, goneNodeTtlMs: 20_000, rebindAfterMs: 15_000, maxP2pArtifacts: 10, clock };
  const core = new SchedulerCore(mine, new StaticDiscovery(["a=http://10.0.0.1:8000"]), o);
  const replica = new SchedulerCore(other, new StaticDiscovery(["a=http://10.0.0.1:8000"]), o);
  try {
    core.startExpiry();
    clock.advance(0);
    await core.sweepsSettled();
    // nothing to run out here, but another replica may write a report: the next scan is report_ttl away
    expect(core.nextSweepAt).toBe(clock.t + 10_000);
    clock.advance(3000);
    await replica.heartbeat(beat("a", ["r1"]));
    clock.advance(7000);
    await core.sweepsSettled();
    // that scan saw the report and armed its end
    expect(core.nextSweepAt).toBe(clock.t - 7000 + 10_001);
    clock.advance(3001);
    await core.sweepsSettled();
    // unhealthy now, its binding kept until gone_node_ttl
    expect((await core.getNode("a")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
    expect(await mine.nodeBindings("a")).toEqual(["r1"]);
    clock.advance(9_999);
    await core.sweepsSettled();
    expect(clock.t).toBe(5_000_000 + 23_000);
    expect(await mine.nodeBindings("a")).toEqual(["r1"]);
    clock.advance(1);
    await core.sweepsSettled();
    expect(await mine.nodeBindings("a")).toEqual([]);
  } finally {
    await core.stopExpiry();
    await mine.close();
    await other.close();
  }
});
