/**
 * Sandboxes outliving their node in a cluster, with the real parts: a scheduler (SQLite, static
 * discovery; report_ttl 2 s, rebind_after 3 s), the gateway, and two nodes (API, orchestrator,
 * SQLite, proxy, reporting every second; LoopbackRuntime guests, no VM) sharing a store of
 * paused sandboxes (LoopbackSharedStore, in memory: the S3 part is test/snapshot/paused-remote
 * and the VM e2e test). Node a stops with shutdown_action "pause" (its bindings stay).
 * - a restarted node re-reports its roster: the gateway routes its sandboxes again (502 naming
 *   it while it is down, never 404);
 * - a node gone for good: a connect through the gateway is refused until the node has been
 *   silent for rebind_after, then resumes the paused sandbox on the other node under the same
 *   id; the node that comes back is told, and drops its copy (the store kept what the other
 *   node resumed from), or keeps state the store lacks as snapshot `fenced-<id>` first;
 * - a sandbox the store has no pause of stays the gone node's (the move is undone) and resumes
 *   there when it is back;
 * - a take-over header sent by a client never reaches a node; a record in the store that does not
 *   fit is refused typed and leaves the store's copy.
 */
import { afterAll, afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { loadConfig } from "../../../src/config/index.ts";
import { TAKE_OVER_HEADER } from "../../../src/cluster/index.ts";
import { gatewayConfig, startGateway, type RunningGateway } from "../../../services/gateway/index.ts";
import { forwardToNode } from "../../../services/gateway/forward.ts";
import type { LoopbackSharedStore } from "../../helpers/loopback-runtime.ts";
import { waitFor } from "../../helpers/wait.ts";
import { freePort, startLoopbackNode, startTestScheduler } from "../helpers.ts";

const KEY = "e2b_" + "ef".repeat(20);
const home = mkdtempSync("/tmp/aenv-gw-moves-");
afterAll(() => rmSync(home, { recursive: true, force: true }));

type LoopNode = Awaited<ReturnType<typeof startLoopbackNode>>;
const cleanup: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/** A cluster of a scheduler, a gateway and nodes a and b sharing one store of paused sandboxes. */
async function cluster() {
  const store: LoopbackSharedStore = { paused: new Map(), marks: new Set() };
  const schedPort = freePort();
  const nodeA = { AENV__orchestrator__shutdown_action: "pause" };
  const start = (name: "a" | "b", again?: LoopNode) =>
    // a restart: the same data dir and address (discovery names the node by its address)
    startLoopbackNode(name, schedPort, KEY, { ...(name === "a" ? nodeA : {}), ...(again ? { AENV_API_ADDR: `127.0.0.1:${again.port}` } : {}) }, ["base"], { home: again?.home, sharedStore: store });
  const nodes: Record<"a" | "b", LoopNode> = { a: await start("a"), b: await start("b") };
  cleanup.push(async () => {
    for (const n of Object.values(nodes)) await n.dispose();
  });
  const sched = await startTestScheduler({
    AENV_HOME_PATH: mkdtempSync(`${home}/s-`),
    AENV__scheduler__addr: `127.0.0.1:${schedPort}`,
    AENV__scheduler__nodes: `a=${nodes.a.url},b=${nodes.b.url}`,
    AENV__scheduler__report_ttl_secs: "2",
    AENV__scheduler__rebind_after_secs: "3",
  });
  cleanup.push(() => sched.close());
  const gw: RunningGateway = startGateway(
    gatewayConfig(loadConfig({ env: { AENV_HOME_PATH: home, AENV_API_KEY: KEY, AENV_LOG_LEVEL: "error", AENV__gateway__addr: "127.0.0.1:0", AENV__cluster__scheduler_endpoint: `127.0.0.1:${schedPort}`, AENV__gateway__node_list_ttl_ms: "200" } })),
  );
  cleanup.push(() => gw.close());
  const api = (path: string, init: RequestInit = {}) => fetch(gw.url + path, { ...init, headers: { "x-api-key": KEY, "content-type": "application/json", ...(init.headers as Record<string, string>) } });
  const lookup = async (id: string) => (await sched.client.lookupNode({ sandboxId: id }).catch(() => null))?.node?.nodeId ?? null;
  /** Create sandboxes through the gateway until one lands on `node`; the others are killed. */
  const createOn = async (node: "a" | "b"): Promise<string> => {
    for (let i = 0; i < 4; i++) {
      const r = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", timeout: 600, metadata: { purpose: "moves" }, envVars: { K: "v" } }) });
      expect(r.status).toBe(201);
      const id = ((await r.json()) as { sandboxID: string }).sandboxID;
      if (r.headers.get("x-agentenv-node-id") === node) return id;
      expect((await api(`/sandboxes/${id}`, { method: "DELETE" })).status).toBe(204);
    }
    throw new Error(`no create landed on ${node}`);
  };
  /** Node a stops (shutdown_action pause: its sandboxes paused, its bindings kept). */
  const stopA = async () => {
    await nodes.a.close();
  };
  const restartA = async () => {
    nodes.a = await start("a", nodes.a);
  };
  return { store, nodes, sched, gw, api, lookup, createOn, stopA, restartA };
}

test("a restarted node re-reports its roster and the gateway routes its sandboxes again; while it is down they answer 502 naming it, never 404", async () => {
  const c = await cluster();
  const x1 = await c.createOn("a");
  const x2 = await c.createOn("a");
  expect((await c.api(`/sandboxes/${x2}/pause`, { method: "POST" })).status).toBe(204);
  await c.stopA();
  const down = await c.api(`/sandboxes/${x1}`);
  expect(down.status).toBe(502);
  expect(((await down.json()) as { message: string }).message).toContain("node a");
  // the scheduler keeps a's bindings once its reports stopped
  await waitFor("a to be UNHEALTHY", async () => (await c.sched.client.getNode({ nodeId: "a", clusterId: "" })).node!.snapshot!.status === 3);
  expect([await c.lookup(x1), await c.lookup(x2)]).toEqual(["a", "a"]);
  expect((await c.api(`/sandboxes/${x2}`)).status).toBe(502);

  await c.restartA();
  // its first roster names both (paused: x1 by the shutdown, x2 by the client)
  await waitFor("a to report again", async () => (await c.sched.client.getNode({ nodeId: "a", clusterId: "" })).node!.snapshot!.status === 1);
  for (const id of [x1, x2]) {
    const r = await c.api(`/sandboxes/${id}`);
    expect(r.status).toBe(200);
    expect(((await r.json()) as { state: string }).state).toBe("paused");
  }
  const back = await c.api(`/sandboxes/${x2}/connect`, { method: "POST", body: JSON.stringify({ timeout: 300 }) });
  expect(back.status).toBe(201);
  expect(back.headers.get("x-agentenv-node-id")).toBe("a");
  expect(c.nodes.a.orch.get(x2).state).toBe("running");
  expect(c.nodes.b.runtime.calls.filter((x) => x.includes(x2))).toEqual([]);
}, 60_000);

test("a node gone for good: its paused sandbox resumes on the other node at connect, same id and settings; the node that comes back drops its copy", async () => {
  const c = await cluster();
  const y = await c.createOn("a");
  const before = c.nodes.a.orch.get(y);
  expect((await c.api(`/sandboxes/${y}/pause`, { method: "POST" })).status).toBe(204);
  expect(c.store.paused.get(y)?.from).toBe("a");
  await c.stopA();
  // too early: a may be restarting, the sandbox stays a's
  const early = await c.api(`/sandboxes/${y}/connect`, { method: "POST", body: JSON.stringify({ timeout: 300 }) });
  expect(early.status).toBe(502);
  expect(await c.lookup(y)).toBe("a");
  expect(c.nodes.b.runtime.calls.filter((x) => x.includes(y))).toEqual([]);
  // once a has been silent for rebind_after, the connect moves it to b
  const moved = await waitFor(
    "the connect to resume y on b",
    async () => {
      const r = await c.api(`/sandboxes/${y}/connect`, { method: "POST", body: JSON.stringify({ timeout: 300 }) });
      return r.status === 201 && r;
    },
    { timeoutMs: 20_000 },
  );
  expect(moved.headers.get("x-agentenv-node-id")).toBe("b");
  const body = (await moved.json()) as { sandboxID: string; envdAccessToken?: string };
  expect(body.sandboxID).toBe(y);
  const onB = c.nodes.b.orch.get(y);
  expect(onB.state).toBe("running");
  expect([onB.envdAccessToken, onB.metadata, onB.envVars, onB.templateId, onB.createdAt]).toEqual([before.envdAccessToken, before.metadata, before.envVars, before.templateId, before.createdAt]);
  expect(c.nodes.b.runtime.calls.filter((x) => x.includes(y))).toEqual([`find:${y}`, `resume:${y}`]);
  expect(c.store.paused.has(y)).toBe(false);
  await waitFor("b's binding of y, held", async () => (await c.sched.core.store.getBinding(y))?.held === true && (await c.lookup(y)) === "b");
  // a later request goes to b
  expect((await c.api(`/sandboxes/${y}`)).headers.get("x-agentenv-node-id")).toBe("b");

  // a comes back with its paused copy: told y is b's, it drops it without touching the store
  await c.restartA();
  await waitFor("a to let its copy go", () => c.nodes.a.runtime.calls.includes(`kill:${y}`));
  expect(c.nodes.a.runtime.calls.filter((x) => x.includes(y))).toEqual([`release:${y}`, `kill:${y}`]);
  expect(() => c.nodes.a.orch.get(y)).toThrow("doesn't exist");
  expect(await c.lookup(y)).toBe("b");
  expect(c.nodes.b.orch.get(y).state).toBe("running");
  const r = await c.api(`/sandboxes/${y}`);
  expect([r.status, r.headers.get("x-agentenv-node-id")]).toEqual([200, "b"]);
}, 60_000);

test("a sandbox the shared store has no pause of stays the gone node's (the move is undone) and resumes there when it is back; state only the returning node has is kept as a snapshot", async () => {
  const c = await cluster();
  const z = await c.createOn("a");
  const w = await c.createOn("a");
  for (const id of [z, w]) expect((await c.api(`/sandboxes/${id}/pause`, { method: "POST" })).status).toBe(204);
  // z's pause never reached the store; w's record there is older than a's copy (a's marks gone)
  c.store.paused.delete(z);
  c.store.marks.delete(`a:${z}`);
  c.store.marks.delete(`a:${w}`);
  await c.stopA();
  const refused = await waitFor(
    "b to be asked for z",
    async () => {
      const res = await c.api(`/sandboxes/${z}/connect`, { method: "POST", body: JSON.stringify({ timeout: 300 }) });
      return c.nodes.b.runtime.calls.includes(`find:${z}`) && res;
    },
    { timeoutMs: 20_000 },
  );
  expect(refused.status).toBe(502);
  expect(((await refused.json()) as { message: string }).message).toContain("no pause snapshot of sandbox");
  expect(await c.lookup(z)).toBe("a");
  // w moves to b from the store's (older) record
  const moved = await c.api(`/sandboxes/${w}/connect`, { method: "POST", body: JSON.stringify({ timeout: 300 }) });
  expect([moved.status, moved.headers.get("x-agentenv-node-id")]).toEqual([201, "b"]);
  await waitFor("b's binding of w, held", async () => (await c.sched.core.store.getBinding(w))?.held === true);

  await c.restartA();
  // w: a's copy is not what the store had: kept as a user snapshot, then dropped
  await waitFor("a to let w go", () => c.nodes.a.runtime.calls.includes(`kill:${w}`));
  expect(c.nodes.a.runtime.calls.filter((x) => x.includes(w))).toEqual([`snapshot:${w}:user`, `kill:${w}`]);
  const snaps = (await (await fetch(`${c.nodes.a.url}/snapshots`, { headers: { "x-api-key": KEY } })).json()) as { names: string[] }[];
  expect(snaps.map((s) => s.names)).toEqual([[`fenced-${w}`]]);
  // z: a's, resumed there
  await waitFor("a to report z", async () => (await c.sched.core.store.getBinding(z))?.held === true && (await c.lookup(z)) === "a");
  const back = await c.api(`/sandboxes/${z}/connect`, { method: "POST", body: JSON.stringify({ timeout: 300 }) });
  expect([back.status, back.headers.get("x-agentenv-node-id")]).toEqual([201, "a"]);
  expect(c.nodes.b.orch.inStates(["paused", "running"]).map((r) => r.id)).toEqual([w]);
}, 60_000);

test("a take-over header from a client never reaches a node (only the gateway sets it); a node asked to take over a sandbox the store has no pause of answers 404", async () => {
  const seen: (string | null)[] = [];
  const capture = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: (req) => (seen.push(req.headers.get(TAKE_OVER_HEADER)), new Response("ok")) });
  cleanup.push(() => capture.stop(true));
  const node = { nodeId: "cap", endpoint: `http://127.0.0.1:${capture.port}` };
  const fromClient = new Request("http://gw/sandboxes/x/connect", { method: "POST", headers: { [TAKE_OVER_HEADER]: "b" }, body: "{}" });
  expect((await forwardToNode(fromClient, node, { pathAndQuery: "/sandboxes/x/connect", timeoutMs: 5000 })).status).toBe(200);
  const fromGateway = new Request("http://gw/sandboxes/x/connect", { method: "POST", body: "{}" });
  expect((await forwardToNode(fromGateway, node, { pathAndQuery: "/sandboxes/x/connect", timeoutMs: 5000, set: { [TAKE_OVER_HEADER]: "a" } })).status).toBe(200);
  expect(seen).toEqual([null, "a"]);

  const c = await cluster();
  const direct = await fetch(`${c.nodes.a.url}/sandboxes/nosuchsandbox1/connect`, { method: "POST", headers: { "x-api-key": KEY, "content-type": "application/json", [TAKE_OVER_HEADER]: "b" }, body: JSON.stringify({ timeout: 60 }) });
  expect(direct.status).toBe(404);
  expect(c.nodes.a.runtime.calls).toEqual(["find:nosuchsandbox1"]);
  // a record that names another sandbox: refused typed, what find adopted is let go, the store's copy stays
  c.store.paused.set("sbxbadrecord1", { record: { id: "someoneelse" }, from: "b" });
  const bad = await fetch(`${c.nodes.a.url}/sandboxes/sbxbadrecord1/connect`, { method: "POST", headers: { "x-api-key": KEY, "content-type": "application/json", [TAKE_OVER_HEADER]: "b" }, body: JSON.stringify({ timeout: 60 }) });
  expect(bad.status).toBe(500);
  expect(((await bad.json()) as { message: string }).message).toContain("the record its pause snapshot carries");
  expect(c.nodes.a.runtime.calls).toEqual(["find:nosuchsandbox1", "find:sbxbadrecord1", "release:sbxbadrecord1"]);
  expect(c.store.paused.has("sbxbadrecord1")).toBe(true);
  expect(() => c.nodes.a.orch.get("sbxbadrecord1")).toThrow("doesn't exist");
}, 60_000);
