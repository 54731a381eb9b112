/**
 * The scheduler as `agentenv scheduler` runs it (startScheduler from config: SQLite or Redis
 * store, static discovery, nice-grpc on 127.0.0.1), driven by a nice-grpc client: statuses
 * for bad input, a restart that keeps every binding, two replicas sharing Redis.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { ClientError, createClient, Status, type Metadata } from "nice-grpc";
import { NodeStatus, schedulerChannel } from "../../../src/cluster/index.ts";
import { ERROR_CODE_TRAILER } from "../../../src/cluster/index.ts";
import { beat, startRedis, startTestScheduler } from "../helpers.ts";

const home = mkdtempSync("/tmp/aenv-sched-grpc-");
afterAll(() => rmSync(home, { recursive: true, force: true }));
const NODES = "a=http://127.0.0.1:18101,b=http://127.0.0.1:18102";

async function status(p: Promise<unknown>): Promise<[Status, string] | null> {
  try {
    await p;
    return null;
  } catch (e) {
    if (!(e instanceof ClientError)) throw e;
    return [e.code, e.details];
  }
}

test("RPCs over gRPC: schedule, record, lookup, heartbeat, observed nodes; bad input → INVALID_ARGUMENT / NOT_FOUND", async () => {
  const s = await startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__nodes: NODES });
  try {
    const c = s.client;
    expect((await c.listNodes({})).nodes).toEqual([
      { nodeId: "a", endpoint: "http://127.0.0.1:18101" },
      { nodeId: "b", endpoint: "http://127.0.0.1:18102" },
    ]);
    const picked = [(await c.schedule({ hint: { newSandbox: { metadata: { k: "v" } } } })).node!.nodeId, (await c.schedule({ hint: undefined })).node!.nodeId];
    expect(picked).toEqual(["a", "b"]);
    await c.recordAssignment({ sandboxId: "sbx1", node: { nodeId: "b", endpoint: "" } });
    expect((await c.lookupNode({ sandboxId: "sbx1" })).node).toEqual({ nodeId: "b", endpoint: "http://127.0.0.1:18102" });
    expect(await status(c.lookupNode({ sandboxId: "missing" }))).toEqual([Status.NOT_FOUND, "no node holds sandbox missing"]);
    expect((await status(c.lookupNode({ sandboxId: "" })))?.[0]).toBe(Status.INVALID_ARGUMENT);
    expect((await status(c.recordAssignment({ sandboxId: "sbx2", node: undefined })))?.[0]).toBe(Status.INVALID_ARGUMENT);
    expect((await status(c.heartbeat(beat("bad id!", []))))?.[0]).toBe(Status.INVALID_ARGUMENT);
    expect((await status(c.getNode({ nodeId: "nope", clusterId: "" })))?.[0]).toBe(Status.NOT_FOUND);
    await c.heartbeat(beat("a", ["sbx3", "sbx4"]));
    expect((await c.lookupNode({ sandboxId: "sbx4" })).node!.nodeId).toBe("a");
    const seen = (await c.listObservedNodes({ clusterId: "" })).nodes;
    expect(seen.map((n) => [n.nodeId, n.snapshot!.status])).toEqual([
      ["a", NodeStatus.NODE_STATUS_READY],
      ["b", NodeStatus.NODE_STATUS_CONNECTING],
    ]);
    expect((await c.getNode({ nodeId: "a", clusterId: "c1" })).node!.snapshot!.sandboxCount).toBe(2);
    await c.unregisterNode({ nodeId: "a", serviceInstanceId: "a-1" });
    expect((await status(c.lookupNode({ sandboxId: "sbx4" })))?.[0]).toBe(Status.NOT_FOUND);
    // a node discovery does not know may not report
    expect(await status(c.heartbeat(beat("ghost", ["sbx1"])))).toEqual([Status.FAILED_PRECONDITION, expect.stringContaining("node ghost, which discovery does not know")]);
    expect((await c.lookupNode({ sandboxId: "sbx1" })).node!.nodeId).toBe("b");
  } finally {
    await s.close();
  }
});

test("errors carry their code in the agentenv-error-code trailer; no schedulable node is FAILED_PRECONDITION at once; garbage protobuf is INVALID_ARGUMENT", async () => {
  const s = await startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__nodes: "a=http://127.0.0.1:18101", AENV__scheduler__db_path: ":memory:" });
  try {
    const trailers: string[] = [];
    const onTrailer = (t: Metadata) => trailers.push(t.get(ERROR_CODE_TRAILER) ?? "");
    await s.client.unregisterNode({ nodeId: "a", serviceInstanceId: "" });
    expect(await status(s.client.schedule({ hint: undefined }, { onTrailer }))).toEqual([Status.FAILED_PRECONDITION, "no schedulable node: every node (a) stopped reporting, left or is draining"]);
    expect((await status(s.client.lookupNode({ sandboxId: "nope" }, { onTrailer })))?.[0]).toBe(Status.NOT_FOUND);
    expect((await status(s.client.lookupNode({ sandboxId: "Bad Id" }, { onTrailer })))?.[0]).toBe(Status.INVALID_ARGUMENT);
    expect(trailers).toEqual(["scheduler.no_nodes", "scheduler.not_found", "scheduler.bad_request"]);
    // raw bytes that are no LookupNodeRequest (field 1 claims 2^35 bytes)
    const raw = createClient(
      {
        lookupNode: { path: "/scheduler.v1.Scheduler/LookupNode", requestStream: false, responseStream: false, requestSerialize: (b: Uint8Array) => b, requestDeserialize: (b: Uint8Array) => b, responseSerialize: (b: Uint8Array) => b, responseDeserialize: (b: Uint8Array) => b, options: {} },
      } as const,
      schedulerChannel(`127.0.0.1:${s.port}`),
    );
    const garbage = await status(raw.lookupNode(new Uint8Array([0x0a, 0xff, 0xff, 0xff, 0xff, 0x7f])));
    expect(garbage).toEqual([Status.INVALID_ARGUMENT, expect.stringContaining("lookupNode: the request is not a valid protobuf message")]);
  } finally {
    await s.close();
  }
});

test("a restarted scheduler (same SQLite file) routes every existing sandbox at once", async () => {
  const env = { AENV_HOME_PATH: home, AENV__scheduler__nodes: NODES, AENV__scheduler__db_path: join(home, "restart.db") };
  const s1 = await startTestScheduler(env);
  const ids = Array.from({ length: 50 }, (_, i) => `keep${i}`);
  for (const id of ids) await s1.client.recordAssignment({ sandboxId: id, node: { nodeId: ids.indexOf(id) % 2 ? "a" : "b", endpoint: "" } });
  await s1.close();
  const s2 = await startTestScheduler(env);
  try {
    const got = await Promise.all(ids.map(async (id) => (await s2.client.lookupNode({ sandboxId: id })).node!.nodeId));
    expect(got).toEqual(ids.map((_, i) => (i % 2 ? "a" : "b")));
  } finally {
    await s2.close();
  }
});

test("two scheduler replicas sharing Redis see each other's bindings and node reports", async () => {
  const redis = await startRedis();
  const env = { AENV_HOME_PATH: home, AENV__scheduler__nodes: NODES, AENV__scheduler__store: "redis", AENV__scheduler__redis_url: redis.url };
  const r1 = await startTestScheduler(env);
  const r2 = await startTestScheduler(env);
  try {
    await r1.client.recordAssignment({ sandboxId: "shared1", node: { nodeId: "a", endpoint: "" } });
    expect((await r2.client.lookupNode({ sandboxId: "shared1" })).node!.nodeId).toBe("a");
    await r2.client.heartbeat(beat("b", ["shared2"]));
    expect((await r1.client.lookupNode({ sandboxId: "shared2" })).node!.nodeId).toBe("b");
    expect((await r1.client.getNode({ nodeId: "b", clusterId: "" })).node!.snapshot!.status).toBe(NodeStatus.NODE_STATUS_READY);
    // Redis gone: RPCs answer UNAVAILABLE (not a hang, not INTERNAL)
    await redis.stop();
    expect((await status(r1.client.lookupNode({ sandboxId: "shared1" })))?.[0]).toBe(Status.UNAVAILABLE);
  } finally {
    await r1.close();
    await r2.close();
    await redis.stop();
  }
});

test("bad configuration stops the scheduler with a clear error", async () => {
  await expect(startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__strategy: "fastest" })).rejects.toThrow(
    'config: AENV__scheduler__strategy: scheduler.strategy = "fastest": expected one of "round_robin", "random", "least_loaded"',
  );
  await expect(startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__nodes: "a=nope" })).rejects.toThrow("is not a URL");
  await expect(startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__store: "redis", AENV__scheduler__redis_url: "redis://127.0.0.1:1" })).rejects.toMatchObject({ code: "scheduler.store_failed" });
});
