/**
 * SchedulerCore over a real SQLite store (in memory) and static discovery, with a test clock:
 * strategies, binding TTL, roster truth, node health, unregister, events, observed nodes, moves
 * off nodes that are gone (rebind) and the fence against a node that comes back.
 */
import { describe, expect, test } from "bun:test";
import { NodeStatus, SandboxEventType } from "../../../src/cluster/index.ts";
import { SchedulerCore, SqliteStore, StaticDiscovery, type SchedulerCoreOptions } from "../../../services/scheduler/index.ts";
import { FakeClock } from "../../helpers/clock.ts";
import { beat } from "../helpers.ts";

function world(o: Partial<SchedulerCoreOptions> = {}, nodes = ["a=http://10.0.0.1:8000", "b=http://10.0.0.2:8000", "c=http://10.0.0.3:8000"], clock = { t: 1_000_000 }, store = new SqliteStore(":memory:")) {
  const core = new SchedulerCore(store, new StaticDiscovery(nodes), { strategy: "round_robin", bindingTtlMs: 30_000, reportTtlMs: 10_000, goneNodeTtlMs: 3_600_000, rebindAfterMs: 60_000, maxP2pArtifacts: 100, now: () => clock.t, ...o });
  return { clock, store, core };
}

async function picks(core: SchedulerCore, n: number): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push((await core.schedule()).nodeId);
  return out;
}

describe("placement", () => {
  test("round_robin cycles through discovered nodes in id order, endpoints from discovery", async () => {
    const { core } = world();
    expect(await picks(core, 7)).toEqual(["a", "b", "c", "a", "b", "c", "a"]);
    expect(await core.schedule()).toEqual({ nodeId: "b", endpoint: "http://10.0.0.2:8000" });
  });

  test("random follows the random source", async () => {
    const seq = [0.9, 0.1, 0.5, 0.0];
    const { core } = world({ strategy: "random", random: () => seq.shift()! });
    expect(await picks(core, 4)).toEqual(["c", "a", "b", "a"]);
  });

  test("least_loaded: fewest running+starting, then most free memory, counting placements since the last heartbeat", async () => {
    const { core } = world({ strategy: "least_loaded" });
    await core.heartbeat(beat("a", ["s1", "s2", "s3"], { freeMiB: 9000 }));
    await core.heartbeat(beat("b", ["s4"], { freeMiB: 1000 }));
    await core.heartbeat(beat("c", ["s5"], { freeMiB: 4000 }));
    // b and c have one each; c has more free memory
    expect(await picks(core, 1)).toEqual(["c"]);
    // c now counts 2 (placement since its heartbeat): b (1) next, then b/c tie at 2 → c by memory
    expect(await picks(core, 3)).toEqual(["b", "c", "b"]);
    // a heartbeat resets the pending count to the reported figure
    await core.heartbeat(beat("a", [], { running: 0, freeMiB: 9000 }));
    expect(await picks(core, 1)).toEqual(["a"]);
  });

  test("least_loaded: a heartbeat whose snapshot predates placements does not forget them", async () => {
    const { core, clock } = world({ strategy: "least_loaded" }, ["a=http://10.0.0.1:8000", "b=http://10.0.0.2:8000"]);
    await core.heartbeat(beat("a", [], { freeMiB: 9000 }));
    await core.heartbeat(beat("b", [], { freeMiB: 8000 }));
    clock.t += 1000;
    const takenBefore = clock.t - 100; // the node read its counts, then took 100 ms for the CPU figure
    expect(await picks(core, 1)).toEqual(["a"]);
    clock.t += 50;
    // a's snapshot was taken before that placement: it still shows 0 sandboxes
    await core.heartbeat(beat("a", [], { freeMiB: 9000, reportedAt: takenBefore }));
    expect(await picks(core, 1)).toEqual(["b"]);
    // a snapshot taken after both placements counts them itself (1 each): tie → most free memory
    clock.t += 50;
    await core.heartbeat(beat("a", ["x1"], { freeMiB: 9000, reportedAt: clock.t }));
    await core.heartbeat(beat("b", ["x2"], { freeMiB: 8000, reportedAt: clock.t }));
    expect(await picks(core, 2)).toEqual(["a", "b"]);
  });

  test("a node that unregistered is not scheduled (least_loaded would prefer its empty load) until it reports again", async () => {
    const { core } = world({ strategy: "least_loaded" }, ["a=http://10.0.0.1:8000", "b=http://10.0.0.2:8000"]);
    await core.heartbeat(beat("a", ["s1", "s2"]));
    await core.heartbeat(beat("b", ["s3"], { instance: "b-old" }));
    expect(await core.unregister("b", "b-old")).toBe(true);
    expect(await picks(core, 3)).toEqual(["a", "a", "a"]);
    expect((await core.getNode("b")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
    expect(await core.unregister("a", "a-1")).toBe(true);
    await expect(core.schedule()).rejects.toMatchObject({ code: "scheduler.no_nodes", message: expect.stringContaining("left") });
    // b starts again (a new instance) and reports
    await core.heartbeat(beat("b", [], { instance: "b-new" }));
    expect(await picks(core, 1)).toEqual(["b"]);
    expect((await core.getNode("b")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_READY);
  });

  test("a node whose reports stopped is skipped; none left → no_nodes naming them", async () => {
    const { core, clock } = world({}, ["a=http://10.0.0.1:8000", "b=http://10.0.0.2:8000"]);
    await core.heartbeat(beat("a", []));
    clock.t += 5_000;
    await core.heartbeat(beat("b", []));
    clock.t += 6_000; // a: 11 s since its report (> 10 s), b: 6 s
    expect(await picks(core, 3)).toEqual(["b", "b", "b"]);
    clock.t += 5_000;
    await expect(core.schedule()).rejects.toMatchObject({ code: "scheduler.no_nodes", message: expect.stringContaining("a, b") });
    // a reports again: schedulable again
    await core.heartbeat(beat("a", []));
    expect(await picks(core, 1)).toEqual(["a"]);
  });

  test("no discovered nodes → no_nodes", async () => {
    const { core } = world({}, []);
    await expect(core.schedule()).rejects.toMatchObject({ code: "scheduler.no_nodes", message: "no nodes discovered" });
  });
});

describe("bindings", () => {
  test("record + lookup; unknown → not_found; malformed ids → bad_request", async () => {
    const { core } = world();
    await core.recordAssignment("sbx1", { nodeId: "b", endpoint: "" });
    expect(await core.lookup("sbx1")).toEqual({ nodeId: "b", endpoint: "http://10.0.0.2:8000" });
    await expect(core.lookup("nope")).rejects.toMatchObject({ code: "scheduler.not_found" });
    await expect(core.lookup("Bad-Id")).rejects.toMatchObject({ code: "scheduler.bad_request" });
    await expect(core.recordAssignment("sbx2", undefined)).rejects.toMatchObject({ code: "scheduler.bad_request" });
    await expect(core.recordAssignment("sbx2", { nodeId: "zz", endpoint: "" })).rejects.toMatchObject({ code: "scheduler.bad_request", message: expect.stringContaining("unknown to discovery") });
    // a node discovery does not know, with an http(s) endpoint given, is accepted
    await core.recordAssignment("sbx3", { nodeId: "zz", endpoint: "http://10.9.9.9:8000/" });
    expect(await core.lookup("sbx3")).toEqual({ nodeId: "zz", endpoint: "http://10.9.9.9:8000" });
    for (const endpoint of ["not a url", "ftp://10.9.9.9/", "victim", "http://"]) {
      await expect(core.recordAssignment("sbx4", { nodeId: "zz", endpoint })).rejects.toMatchObject({ code: "scheduler.bad_request", message: expect.stringContaining("not an http(s) URL") });
    }
    expect(await core.lookup("sbx4").catch((e) => e.code)).toBe("scheduler.not_found");
  });

  test("a node discovery does not know cannot report: its roster and events take over no binding", async () => {
    const { core, store } = world();
    await core.recordAssignment("victim", { nodeId: "a", endpoint: "" });
    await expect(core.heartbeat(beat("ghost", ["victim"]))).rejects.toMatchObject({ code: "scheduler.unknown_node", message: expect.stringContaining("node ghost") });
    const create = { sandboxId: "victim", eventType: SandboxEventType.SANDBOX_EVENT_TYPE_CREATE, requestedCpu: 0, requestedMemoryBytes: 0, requestedDiskBytes: 0 };
    await expect(core.reportEvents({ nodeId: "ghost", clusterId: "", serviceInstanceId: "", events: [create] })).rejects.toMatchObject({ code: "scheduler.unknown_node" });
    expect(await core.lookup("victim")).toEqual({ nodeId: "a", endpoint: "http://10.0.0.1:8000" });
    expect(await store.getReport("ghost")).toBeNull();
    expect((await core.listObserved()).map((n) => n.nodeId)).toEqual(["a", "b", "c"]);
  });

  test("sandbox events of a type outside the contract are refused whole and bind nothing", async () => {
    const { core, store } = world();
    const ev = (sandboxId: string, eventType: number) => ({ sandboxId, eventType, requestedCpu: 0, requestedMemoryBytes: 0, requestedDiskBytes: 0 });
    for (const t of [99, SandboxEventType.SANDBOX_EVENT_TYPE_UNSPECIFIED]) {
      await expect(core.reportEvents({ nodeId: "a", clusterId: "", serviceInstanceId: "", events: [ev("ok1", SandboxEventType.SANDBOX_EVENT_TYPE_CREATE), ev("odd1", t)] })).rejects.toMatchObject({ code: "scheduler.bad_request", message: expect.stringContaining(`unknown sandbox event type ${t}`) });
    }
    expect(await store.countBindings()).toBe(0);
    await core.reportEvents({ nodeId: "a", clusterId: "", serviceInstanceId: "", events: [ev("f1", SandboxEventType.SANDBOX_EVENT_TYPE_FORK), ev("p1", SandboxEventType.SANDBOX_EVENT_TYPE_PAUSE), ev("r1", SandboxEventType.SANDBOX_EVENT_TYPE_RESUME)] });
    expect(await store.nodeBindings("a")).toEqual(["f1", "p1", "r1"]);
  });

  test("binding_ttl: a binding of a node that never reported, not refreshed, is dropped at lookup", async () => {
    const { core, clock, store } = world();
    await core.recordAssignment("old", { nodeId: "c", endpoint: "" });
    clock.t += 20_000;
    await core.recordAssignment("kept", { nodeId: "c", endpoint: "" });
    clock.t += 15_000; // old: 35 s since it was recorded, kept 15 s
    await expect(core.lookup("old")).rejects.toMatchObject({ code: "scheduler.not_found", message: expect.stringContaining("not refreshed for 30000 ms") });
    expect(await store.getBinding("old")).toBeNull();
    expect((await core.lookup("kept")).nodeId).toBe("c");
  });

  test("bindings of a node whose reports stopped keep routing to it until gone_node_ttl after its last report", async () => {
    const { core, clock, store } = world({ goneNodeTtlMs: 120_000 });
    await core.heartbeat(beat("a", ["s1", "s2"]));
    clock.t += 100_000; // silent: UNHEALTHY (report_ttl 10 s), bindings kept
    expect((await core.getNode("a")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
    expect(await core.sweep()).toEqual([]);
    expect(await core.lookup("s1")).toEqual({ nodeId: "a", endpoint: "http://10.0.0.1:8000" });
    clock.t += 20_001;
    await expect(core.lookup("s1")).rejects.toMatchObject({ code: "scheduler.not_found", message: expect.stringContaining("its node a has not reported for 120000 ms") });
    expect(await core.sweep()).toEqual(["a"]);
    expect(await store.nodeBindings("a")).toEqual([]);
  });

  test("heartbeat roster is the truth: missing bindings dropped, listed ones added, newer ones kept, other nodes' left alone", async () => {
    const { core, clock, store } = world();
    await core.recordAssignment("s1", { nodeId: "a", endpoint: "" });
    await core.recordAssignment("s2", { nodeId: "a", endpoint: "" });
    await core.recordAssignment("moved", { nodeId: "b", endpoint: "" });
    clock.t += 1000;
    const takenAt = clock.t;
    clock.t += 500;
    // recorded after the roster below was taken: must survive it
    await core.recordAssignment("fresh", { nodeId: "a", endpoint: "" });
    clock.t += 500;
    // "moved" is recorded for b, which has not confirmed it: neither a's nor foreign
    const change = await core.heartbeat(beat("a", ["s1", "s3", "moved"], { reportedAt: takenAt }));
    expect(change).toEqual({ added: 1, removed: 1, foreign: [] });
    expect(await store.nodeBindings("a")).toEqual(["fresh", "s1", "s3"]);
    expect(await store.nodeBindings("b")).toEqual(["moved"]);
    expect(await store.getBinding("s2")).toBeNull();
    expect((await core.lookup("s3")).endpoint).toBe("http://10.0.0.1:8000");
    // the next roster without "fresh" drops it
    clock.t += 1000;
    await core.heartbeat(beat("a", ["s1"], { reportedAt: clock.t }));
    expect(await store.nodeBindings("a")).toEqual(["s1"]);
  });

  test("a roster with a malformed id or a bad node id is refused whole", async () => {
    const { core, store } = world();
    await core.recordAssignment("s1", { nodeId: "a", endpoint: "" });
    await expect(core.heartbeat(beat("a", ["ok", "NOT OK"]))).rejects.toMatchObject({ code: "scheduler.bad_request" });
    await expect(core.heartbeat(beat("", []))).rejects.toMatchObject({ code: "scheduler.bad_request" });
    expect(await store.nodeBindings("a")).toEqual(["s1"]);
  });

  test("sandbox events never take a sandbox another node holds", async () => {
    const { core } = world();
    const ev = (sandboxId: string, eventType: SandboxEventType) => ({ sandboxId, eventType, requestedCpu: 0, requestedMemoryBytes: 0, requestedDiskBytes: 0 });
    await core.heartbeat(beat("b", ["held1"]));
    await core.recordAssignment("loose1", { nodeId: "b", endpoint: "" });
    await core.reportEvents({ nodeId: "a", clusterId: "", serviceInstanceId: "", events: [ev("held1", SandboxEventType.SANDBOX_EVENT_TYPE_RESUME), ev("loose1", SandboxEventType.SANDBOX_EVENT_TYPE_RESUME)] });
    expect((await core.lookup("held1")).nodeId).toBe("b");
    // recorded for b but never confirmed by it: the node that reports it running has it
    expect((await core.lookup("loose1")).nodeId).toBe("a");
  });

  test("sandbox events: create/resume bind, delete unbinds only from the reporting node", async () => {
    const { core, store } = world();
    await core.reportEvents({ nodeId: "a", clusterId: "", serviceInstanceId: "", events: [{ sandboxId: "e1", eventType: SandboxEventType.SANDBOX_EVENT_TYPE_CREATE, requestedCpu: 1, requestedMemoryBytes: 0, requestedDiskBytes: 0 }] });
    expect((await core.lookup("e1")).nodeId).toBe("a");
    await core.reportEvents({ nodeId: "b", clusterId: "", serviceInstanceId: "", events: [{ sandboxId: "e1", eventType: SandboxEventType.SANDBOX_EVENT_TYPE_DELETE, requestedCpu: 0, requestedMemoryBytes: 0, requestedDiskBytes: 0 }] });
    expect((await core.lookup("e1")).nodeId).toBe("a");
    await core.reportEvents({ nodeId: "a", clusterId: "", serviceInstanceId: "", events: [{ sandboxId: "e1", eventType: SandboxEventType.SANDBOX_EVENT_TYPE_DELETE, requestedCpu: 0, requestedMemoryBytes: 0, requestedDiskBytes: 0 }] });
    expect(await store.getBinding("e1")).toBeNull();
  });
});

describe("nodes", () => {
  test("observed nodes: READY, CONNECTING, UNHEALTHY; getNode of an unknown node → not_found", async () => {
    const { core, clock } = world();
    await core.heartbeat(beat("a", ["x1"]));
    clock.t += 6000;
    await core.heartbeat(beat("b", []));
    clock.t += 5000;
    const seen = await core.listObserved();
    expect(seen.map((n) => [n.nodeId, n.snapshot!.status, n.endpoint])).toEqual([
      ["a", NodeStatus.NODE_STATUS_UNHEALTHY, "http://10.0.0.1:8000"],
      ["b", NodeStatus.NODE_STATUS_READY, "http://10.0.0.2:8000"],
      ["c", NodeStatus.NODE_STATUS_CONNECTING, "http://10.0.0.3:8000"],
    ]);
    expect(seen[0]!.machineInfo!.cpuModelName).toBe("Test CPU");
    expect(seen[0]!.snapshot!.sandboxCount).toBe(1);
    expect((await core.getNode("b")).serviceInstanceId).toBe("b-1");
    await expect(core.getNode("zz")).rejects.toMatchObject({ code: "scheduler.not_found" });
    expect((await core.listObserved("other-cluster")).map((n) => n.nodeId)).toEqual(["c"]);
  });

  test("sweep drops the bindings of a node silent past gone_node_ttl, once", async () => {
    const { core, clock, store } = world({ goneNodeTtlMs: 30_000 });
    await core.heartbeat(beat("a", ["s1", "s2"]));
    await core.heartbeat(beat("b", ["s3"]));
    clock.t += 29_000;
    await core.heartbeat(beat("b", ["s3"]));
    expect(await core.sweep()).toEqual([]);
    expect(await store.nodeBindings("a")).toEqual(["s1", "s2"]);
    clock.t += 2000;
    expect(await core.sweep()).toEqual(["a"]);
    expect(await store.nodeBindings("a")).toEqual([]);
    expect((await core.lookup("s3")).nodeId).toBe("b");
    expect(await core.sweep()).toEqual([]);
  });

  test("report expiry is one timer armed at the earliest report's next bound: a gone node's bindings are dropped at that moment, never before, and nothing fires while no report can run out", async () => {
    const clock = new FakeClock(1_000_000);
    const t0 = clock.t;
    const { core, store } = world({ clock, goneNodeTtlMs: 20_000 }, undefined, clock);
    core.startExpiry();
    clock.advance(0);
    await core.sweepsSettled();
    // no report: nothing armed (SQLite: no other replica writes reports)
    expect([core.nextSweepAt, clock.pending]).toEqual([null, []]);
    await core.heartbeat(beat("a", ["s1"]));
    clock.advance(5000);
    await core.heartbeat(beat("b", ["s2"]));
    expect(core.nextSweepAt).toBe(t0 + 10_001);
    clock.advance(5001); // a's report just passed report_ttl: UNHEALTHY, bindings kept, next bound: b's report_ttl
    await core.sweepsSettled();
    expect(await store.nodeBindings("a")).toEqual(["s1"]);
    expect(core.nextSweepAt).toBe(t0 + 15_001);
    // b reports again before its report_ttl: that firing only moves the timer on
    clock.advance(2000);
    await core.heartbeat(beat("b", ["s2"]));
    clock.advance(3000);
    await core.sweepsSettled();
    expect(core.nextSweepAt).toBe(t0 + 20_001);
    clock.advance(4999); // a: exactly gone_node_ttl old
    await core.sweepsSettled();
    expect(await store.nodeBindings("a")).toEqual(["s1"]);
    clock.advance(1);
    await core.sweepsSettled();
    expect([await store.nodeBindings("a"), await store.nodeBindings("b")]).toEqual([[], ["s2"]]);
    expect(core.nextSweepAt).toBe(t0 + 22_002);
    await core.stopExpiry();
    expect(clock.pending).toEqual([]);
  });

  test("a restarted scheduler counts saved reports from its own start: a minute of downtime drops no binding", async () => {
    const first = world({ goneNodeTtlMs: 30_000 });
    await first.core.heartbeat(beat("a", ["keep1", "keep2"]));
    await first.core.recordAssignment("keep3", { nodeId: "a", endpoint: "" });
    first.clock.t += 60_000; // the scheduler was down for a minute (report_ttl is 10 s, gone_node_ttl 30 s)
    const { core, store, clock } = world({ goneNodeTtlMs: 30_000 }, undefined, first.clock, first.store);
    expect(await core.sweep()).toEqual([]);
    expect(await store.countBindings()).toBe(3);
    expect((await core.lookup("keep1")).nodeId).toBe("a");
    expect((await core.getNode("a")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_READY);
    expect(await picks(core, 3)).toEqual(["a", "b", "c"]);
    // a node that really stopped reporting is UNHEALTHY report_ttl after the restart, gone gone_node_ttl after it
    clock.t += 10_001;
    expect((await core.getNode("a")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
    expect(await core.sweep()).toEqual([]);
    clock.t += 20_000;
    expect(await core.sweep()).toEqual(["a"]);
    expect(await store.countBindings()).toBe(0);
  });

  test("unregister keeping bindings (sandboxes outlive the process): marked left, not scheduled, its sandboxes still routed to it", async () => {
    const { core, store, clock } = world();
    await core.heartbeat(beat("a", ["s1", "s2"]));
    expect(await core.unregister("a", "a-1", true)).toBe(true);
    expect((await core.getNode("a")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
    expect(await picks(core, 2)).toEqual(["b", "c"]);
    expect(await core.lookup("s1")).toEqual({ nodeId: "a", endpoint: "http://10.0.0.1:8000" });
    // the restarted node's first roster: what it still holds
    clock.t += 5000;
    await core.heartbeat(beat("a", ["s2"], { instance: "a-2" }));
    expect(await store.nodeBindings("a")).toEqual(["s2"]);
    expect((await core.getNode("a")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_READY);
  });

  test("unregister drops the node's bindings and marks it left; one from an older instance is ignored", async () => {
    const { core, store, clock } = world();
    await core.heartbeat(beat("a", ["s1"], { instance: "new" }));
    expect(await core.unregister("a", "old")).toBe(false);
    expect((await core.lookup("s1")).nodeId).toBe("a");
    expect(await core.unregister("a", "new")).toBe(true);
    await expect(core.lookup("s1")).rejects.toMatchObject({ code: "scheduler.not_found" });
    expect(await store.getReport("a")).toMatchObject({ leftAtUnixMs: clock.t, node: { serviceInstanceId: "new" } });
    expect((await core.getNode("a")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
    // a node that never reported can leave too
    expect(await core.unregister("c", "c-1")).toBe(true);
    expect((await core.getNode("c")).snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
    expect(await picks(core, 2)).toEqual(["b", "b"]);
  });

  test("rebind: refused while the node is not gone; then the sandbox moves to a live node, once; the node that comes back keeps it until the new node holds it, then is told to drop it", async () => {
    const { core, clock, store } = world({ rebindAfterMs: 30_000 });
    await core.heartbeat(beat("a", ["p1", "p2"]));
    await core.heartbeat(beat("b", []));
    await core.heartbeat(beat("c", []));
    await expect(core.rebind("p1", "a")).rejects.toMatchObject({ code: "scheduler.node_alive", message: expect.stringContaining("reported 0 ms ago") });
    await expect(core.rebind("p1", "Bad!")).rejects.toMatchObject({ code: "scheduler.bad_request" });
    await expect(core.rebind("none", "a")).rejects.toMatchObject({ code: "scheduler.not_found" });
    clock.t += 20_000;
    await core.heartbeat(beat("b", []));
    await core.heartbeat(beat("c", []));
    // 20 s silent: UNHEALTHY, but not gone for moves
    await expect(core.rebind("p1", "a")).rejects.toMatchObject({ code: "scheduler.node_alive" });
    clock.t += 10_001;
    await core.heartbeat(beat("b", []));
    await core.heartbeat(beat("c", []));
    const first = await core.rebind("p1", "a");
    expect(first).toEqual({ node: { nodeId: "b", endpoint: "http://10.0.0.2:8000" }, moved: true });
    expect(await store.getBinding("p1")).toMatchObject({ nodeId: "b", held: false });
    // a second caller that also found a gone: answered where it is now, nothing moves
    expect(await core.rebind("p1", "a")).toEqual({ node: { nodeId: "b", endpoint: "http://10.0.0.2:8000" }, moved: false });
    expect((await core.lookup("p1")).nodeId).toBe("b");
    // a comes back before b holds p1: a keeps its copy (not foreign), the binding stays b's
    expect(await core.heartbeat(beat("a", ["p1", "p2"], { instance: "a-2" }))).toMatchObject({ foreign: [] });
    expect((await core.lookup("p1")).nodeId).toBe("b");
    // b resumed it (its event): held there; a's next roster is told to drop its copy
    await core.reportEvents({ nodeId: "b", clusterId: "", serviceInstanceId: "", events: [{ sandboxId: "p1", eventType: SandboxEventType.SANDBOX_EVENT_TYPE_RESUME, requestedCpu: 1, requestedMemoryBytes: 0, requestedDiskBytes: 0 }] });
    clock.t += 1000;
    expect(await core.heartbeat(beat("a", ["p1", "p2"], { instance: "a-2", reportedAt: clock.t }))).toEqual({ added: 0, removed: 0, foreign: ["p1"] });
    expect(await store.nodeBindings("a")).toEqual(["p2"]);
    // a dropped it: its roster no longer lists it, nothing changes
    clock.t += 1000;
    expect(await core.heartbeat(beat("a", ["p2"], { instance: "a-2", reportedAt: clock.t }))).toEqual({ added: 0, removed: 0, foreign: [] });
    expect(await store.nodeBindings("b")).toEqual(["p1"]);
  });

  test("rebind to a node that could not take the sandbox: its roster drops the binding and the old node takes it back", async () => {
    const { core, clock, store } = world({ rebindAfterMs: 30_000 });
    await core.heartbeat(beat("a", ["p1"]));
    clock.t += 31_000;
    await core.heartbeat(beat("b", []));
    await core.heartbeat(beat("c", []));
    expect((await core.rebind("p1", "a")).node.nodeId).toBe("b");
    // b never took it (its store has no pause snapshot of p1): its next roster lacks it
    clock.t += 1000;
    await core.heartbeat(beat("b", [], { reportedAt: clock.t }));
    expect(await store.getBinding("p1")).toBeNull();
    // a comes back and lists it: a's again
    expect(await core.heartbeat(beat("a", ["p1"], { instance: "a-2" }))).toEqual({ added: 1, removed: 0, foreign: [] });
    expect((await core.lookup("p1")).nodeId).toBe("a");
  });

  test("rebind of a node that never reported is refused; with no other live node, no_nodes", async () => {
    const { core, clock } = world({ rebindAfterMs: 30_000 }, ["a=http://10.0.0.1:8000", "b=http://10.0.0.2:8000"]);
    await core.recordAssignment("q1", { nodeId: "a", endpoint: "" });
    await expect(core.rebind("q1", "a")).rejects.toMatchObject({ code: "scheduler.node_alive", message: expect.stringContaining("never reported") });
    await core.heartbeat(beat("a", ["q1"]));
    await core.heartbeat(beat("b", []));
    clock.t += 31_000; // both silent
    await expect(core.rebind("q1", "a")).rejects.toMatchObject({ code: "scheduler.no_nodes" });
    expect((await core.lookup("q1")).nodeId).toBe("a");
  });

  test("P2P: peers from heartbeats, artifacts bounded and looked up", async () => {
    const { core } = world({ maxP2pArtifacts: 2 });
    await core.heartbeat({ ...beat("a", []), p2pEndpoint: { backend: "iroh", address: "a-addr" } });
    await core.heartbeat({ ...beat("b", []), p2pEndpoint: { backend: "iroh", address: "b-addr" } });
    await core.heartbeat(beat("c", []));
    expect((await core.p2pPeers("", "iroh", "a")).map((p) => p.nodeId)).toEqual(["b"]);
    core.recordArtifact("", "iroh", "k1", "a");
    core.recordArtifact("", "iroh", "k1", "b");
    expect((await core.lookupArtifact("", "iroh", "k1", "b")).map((p) => p.nodeId)).toEqual(["a"]);
    core.recordArtifact("", "iroh", "k2", "a");
    core.recordArtifact("", "iroh", "k3", "a"); // bound 2: k1 (oldest) goes
    expect(await core.lookupArtifact("", "iroh", "k1", "")).toEqual([]);
    core.forgetArtifact("", "iroh", "k3", "a");
    expect(await core.lookupArtifact("", "iroh", "k3", "")).toEqual([]);
    expect(() => core.recordArtifact("", "iroh", "", "a")).toThrow("key is empty");
  });
});

test("static discovery refuses malformed and duplicate entries", () => {
  expect(() => new StaticDiscovery(["a"])).toThrow('expected "id=http://host:port"');
  expect(() => new StaticDiscovery(["a=ftp://x"])).toThrow("http or https");
  expect(() => new StaticDiscovery(["a=not a url"])).toThrow("is not a URL");
  expect(() => new StaticDiscovery(["a=http://x:1", "a=http://y:1"])).toThrow("twice");
  expect(new StaticDiscovery(["b=http://y:1/", "a=http://x:1"]).nodes().active).toEqual([
    { nodeId: "a", endpoint: "http://x:1" },
    { nodeId: "b", endpoint: "http://y:1" },
  ]);
});
