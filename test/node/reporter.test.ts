/**
 * Node → scheduler reporting with the real parts: a node (API, orchestrator, SQLite; no VM:
 * sandboxes adopted on loopback) configured through the upstream environment variables, and a
 * scheduler on 127.0.0.1 (SQLite store, static discovery naming the node).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { grpcTarget, NodeStatus } from "../../src/cluster/index.ts";
import { loadConfig } from "../../src/config/index.ts";
import { parseCpuinfo } from "../../src/observability/identity.ts";
import { eventTypeOf } from "../../src/node/reporter.ts";
import { reporterOptions } from "../../src/node/reporting.ts";
import { createLoopback, startNodeNoVm, type TestNode } from "../api/helpers.ts";
import { startTestScheduler } from "../services/helpers.ts";
import { waitFor } from "../helpers/wait.ts";

const home = mkdtempSync("/tmp/aenv-report-");
let sched: Awaited<ReturnType<typeof startTestScheduler>>;
let node: TestNode;

beforeAll(async () => {
  sched = await startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__nodes: "rep-node=http://127.0.0.1:1" });
  node = await startNodeNoVm({
    AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "true",
    AENV_OBSERVABILITY_SCHEDULER_ENDPOINT: `http://127.0.0.1:${sched.port}`,
    AENV_OBSERVABILITY_REPORT_INTERVAL_SECS: "1",
    AENV_NODE_ID: "rep-node",
    AENV_CLUSTER_ID: "c9",
  }, undefined, {});
});
afterAll(async () => {
  await node?.dispose();
  await sched?.close();
  rmSync(home, { recursive: true, force: true });
});

test("heartbeats carry identity, machine, host figures and counters; events and rosters move bindings; shutdown unregisters", async () => {
  const seen = await waitFor("a first heartbeat", async () => {
    const r = await sched.client.getNode({ nodeId: "rep-node", clusterId: "" });
    return r.node!.snapshot!.status === NodeStatus.NODE_STATUS_READY && r;
  }, { retryErrors: true });
  const n = seen.node!;
  expect(n.clusterId).toBe("c9");
  expect(n.serviceInstanceId).toMatch(/^rep-node-[0-9a-f]{8}$/);
  expect(n.version).toBe("0.1.0");
  expect(n.machineInfo!.cpuArchitecture).toBe(process.arch);
  expect(n.machineInfo!.cpuModelName.length).toBeGreaterThan(0);
  expect(n.snapshot!.memoryTotalBytes).toBe(require("node:os").totalmem());
  expect(n.snapshot!.cpuCount).toBe(require("node:os").cpus().length);
  expect(n.snapshot!.disks[0]!.mountPoint).toBe(node.home);
  expect(n.snapshot!.disks[0]!.totalBytes).toBeGreaterThan(0);
  expect(n.snapshot!.sandboxCount).toBe(0);

  // a sandbox appears: bound (event or roster), counted in the next snapshot
  const beforeCreate = Date.now();
  const repsbx1 = (await createLoopback(node, { cpuCount: 2, memoryMB: 256 })).id;
  await waitFor("the binding of repsbx1", async () => (await sched.client.lookupNode({ sandboxId: repsbx1 })).node!.nodeId === "rep-node", { retryErrors: true });
  const after = await waitFor("a snapshot counting it", async () => {
    const r = await sched.client.getNode({ nodeId: "rep-node", clusterId: "" });
    return r.node!.snapshot!.sandboxCount === 1 && r;
  });
  expect(after.node!.snapshot!.allocatedCpu).toBe(2);
  expect(after.node!.snapshot!.allocatedMemoryBytes).toBe(256 * 1024 * 1024);
  // the counting snapshot was taken after the create (order, not a wall-clock bound)
  expect(after.node!.snapshot!.reportedAtUnixMs).toBeGreaterThanOrEqual(beforeCreate);
  expect(after.node!.snapshot!.reportedAtUnixMs).toBeLessThanOrEqual(Date.now());

  // a binding the node does not hold is dropped by its next roster
  await sched.client.recordAssignment({ sandboxId: "ghost", node: { nodeId: "rep-node", endpoint: "" } });
  await waitFor("the roster to drop ghost", async () => (await sched.core.store.getBinding("ghost")) === null);

  // killed: unbound
  await node.orch.kill(repsbx1);
  await waitFor("repsbx1 unbound", async () => (await sched.core.store.getBinding(repsbx1)) === null);

  // shutdown: UnregisterNode drops the node's bindings and marks it left (not scheduled)
  const repsbx2 = (await createLoopback(node)).id;
  await waitFor("repsbx2 bound", async () => (await sched.core.store.getBinding(repsbx2)) !== null);
  await node.close();
  expect((await sched.core.store.getReport("rep-node"))!.leftAtUnixMs).toBeGreaterThan(0);
  expect(await sched.core.store.getBinding(repsbx2)).toBeNull();
  expect((await sched.client.getNode({ nodeId: "rep-node", clusterId: "" })).node!.snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
  const refused = await sched.client.schedule({ hint: undefined }).then(
    () => "scheduled",
    (e: Error) => e.message,
  );
  expect(refused).toContain("FAILED_PRECONDITION: no schedulable node: every node (rep-node) stopped reporting, left or is draining");
}, 30_000);

test("config: the upstream env names override the TOML; enabled without an endpoint is refused", () => {
  const cfg = loadConfig({ env: { AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "true", AENV_OBSERVABILITY_SCHEDULER_ENDPOINT: "http://sched:9090", AENV_OBSERVABILITY_REPORT_INTERVAL_SECS: "7" } });
  expect(reporterOptions(cfg)).toEqual({ endpoint: "http://sched:9090", intervalMs: 7000, timeoutMs: 3000, eventFlushMs: 100, eventBatchMax: 1000, keepBindings: false });
  // sandboxes a stop leaves behind keep their bindings
  expect(reporterOptions(loadConfig({ env: { AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "true", AENV_OBSERVABILITY_SCHEDULER_ENDPOINT: "s:1", AENV__orchestrator__shutdown_action: "pause" } }))?.keepBindings).toBe(true);
  expect(reporterOptions(loadConfig({ env: {} }))).toBeNull();
  expect(() => reporterOptions(loadConfig({ env: { AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "true" } }))).toThrow("scheduler_endpoint");
  expect(() => reporterOptions(loadConfig({ env: { AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "yes" } }))).toThrow("AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED");
  expect(grpcTarget("http://sched:9090/")).toBe("sched:9090");
});

test("a node whose scheduler is down still starts and serves; lifecycle mapping; /proc/cpuinfo parsing", async () => {
  const n = await startNodeNoVm({ AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "true", AENV_OBSERVABILITY_SCHEDULER_ENDPOINT: "127.0.0.1:1", AENV_OBSERVABILITY_REPORT_INTERVAL_SECS: "1" });
  try {
    expect((await fetch(`${n.url}/health`)).status).toBe(200);
  } finally {
    await n.dispose();
  }
  expect(eventTypeOf({ id: "x", from: "creating", to: "running" })).toBe(1);
  expect(eventTypeOf({ id: "x", from: "resuming", to: "running" })).toBe(4);
  expect(eventTypeOf({ id: "x", from: "pausing", to: "paused" })).toBe(3);
  expect(eventTypeOf({ id: "x", from: "killing", to: "killed" })).toBe(2);
  expect(eventTypeOf({ id: "x", from: "running", to: "pausing" })).toBeNull();
  expect(parseCpuinfo("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\nmodel name\t: other\n", "x64")).toEqual({ cpuFamily: "25", cpuModel: "17", cpuModelName: "AMD EPYC", cpuArchitecture: "x64" });
});
