/**
 * The gateway with the real parts around it: a scheduler (SQLite, static discovery), two nodes
 * (API, orchestrator, SQLite, proxy; sandboxes are LoopbackRuntime servers on 127.0.0.1, no VM)
 * reporting every second, and the gateway on 127.0.0.1 — driven over HTTP and WebSocket.
 * Tests run in order and share the cluster.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { Sandbox } from "e2b";
import { loadConfig } from "../../../src/config/index.ts";
import { gatewayConfig, startGateway, type RunningGateway } from "../../../services/gateway/index.ts";
import { NodeStatus } from "../../../src/cluster/index.ts";
import { freePort, startLoopbackNode, startTestScheduler } from "../helpers.ts";

const KEY = "e2b_" + "ab".repeat(20);
const home = mkdtempSync("/tmp/aenv-gw-");
let schedPort: number;
let sched: Awaited<ReturnType<typeof startTestScheduler>>;
let nodes: Awaited<ReturnType<typeof startLoopbackNode>>[];
let gw: RunningGateway;
const ids: string[] = [];
const placed: Record<string, string> = {};

function schedulerEnv() {
  return { AENV_HOME_PATH: home, AENV__scheduler__addr: `127.0.0.1:${schedPort}`, AENV__scheduler__nodes: nodes.map((n, i) => `${"ab"[i]}=${n.url}`).join(","), AENV__scheduler__report_ttl_secs: "2" };
}

const api = (path: string, init: RequestInit & { key?: string | null } = {}) => {
  const headers = new Headers(init.headers);
  if (init.key !== null) headers.set("x-api-key", init.key ?? KEY);
  if (init.body && !headers.has("content-type")) headers.set("content-type", "application/json");
  return fetch(gw.url + path, { ...init, headers });
};

beforeAll(async () => {
  schedPort = freePort();
  // b stops keeping its sandboxes (paused) and so their bindings: they stay routed to it
  nodes = [await startLoopbackNode("a", schedPort, KEY), await startLoopbackNode("b", schedPort, KEY, { AENV__orchestrator__shutdown_action: "pause" }, ["base", "onlyb"])];
  sched = await startTestScheduler(schedulerEnv());
  gw = startGateway(gatewayConfig(loadConfig({ env: { AENV_HOME_PATH: home, AENV_API_KEY: KEY, AENV_LOG_LEVEL: "error", AENV__gateway__addr: "127.0.0.1:0", AENV__cluster__scheduler_endpoint: `127.0.0.1:${schedPort}`, AENV__gateway__sandbox_proxy_domains: "sbx.test", AENV__gateway__request_timeout_ms: "5000", AENV__gateway__scheduler_timeout_ms: "2500" } })));
});

afterAll(async () => {
  await gw?.close();
  await sched?.close();
  for (const n of nodes ?? []) await n.dispose();
  rmSync(home, { recursive: true, force: true });
});

test("auth: the gateway's key is required on the control plane, not on /health", async () => {
  expect((await api("/v2/sandboxes", { key: null })).status).toBe(401);
  const bad = await api("/v2/sandboxes", { key: "e2b_wrong" });
  expect(bad.status).toBe(401);
  expect((await bad.json() as any).code).toBe(401);
  expect(await (await api("/health", { key: null })).json()).toMatchObject({ status: "ok", role: "gateway" });
});

test("create: Schedule picks the node, the node creates, the binding is recorded; domain is the gateway's", async () => {
  for (let i = 0; i < 4; i++) {
    const r = await api(i % 2 ? "/sandboxes" : "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", timeout: 600, metadata: { n: String(i), team: i < 2 ? "x" : "y" }, ...(i % 2 ? { secure: true } : {}) }) });
    expect(r.status).toBe(201);
    const body: any = await r.json();
    expect(body.domain).toBe("sbx.test");
    expect(body.envdAccessToken).toMatch(/^[0-9a-f]+$/);
    ids.push(body.sandboxID);
  }
  for (const id of ids) placed[id] = (await sched.client.lookupNode({ sandboxId: id })).node!.nodeId;
  expect(ids.map((id) => placed[id])).toEqual(["a", "b", "a", "b"]);
  // the answering node is named on forwarded responses
  for (const id of ids) expect((await api(`/sandboxes/${id}`)).headers.get("x-agentenv-node-id")).toBe(placed[id]!);
  expect(nodes[0]!.runtime.starts).toBe(2);
  expect(nodes[1]!.runtime.starts).toBe(2);
  // bad input: malformed JSON is refused by the gateway, a bad field by the node
  const malformed = await api("/v2/sandboxes", { method: "POST", body: "{nope" });
  expect([malformed.status, ((await malformed.json()) as any).message]).toEqual([400, expect.stringMatching(/^the request body is not valid JSON: /)]);
  // a JSON text sent as text/plain is refused for its content type, naming it (webhooks too: the gateway reads both)
  for (const path of ["/v2/sandboxes", "/events/webhooks"]) {
    const plain = await api(path, { method: "POST", body: JSON.stringify({ templateID: "base" }), headers: { "content-type": "text/plain" } });
    expect([path, plain.status, await plain.json()]).toEqual([path, 400, { code: 400, error_code: "gateway.bad_request", message: 'this route takes a JSON body (content-type: application/json); the request sent content-type "text/plain"' }]);
  }
  const bad = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", timeout: -5 }) });
  expect(bad.status).toBe(400);
  expect((await bad.json() as any).code).toBe(400);
});

test("control routes go to the sandbox's node; an unknown id is 404 (that no node is asked: faults.test.ts)", async () => {
  for (const id of ids) {
    const r = await api(`/sandboxes/${id}`);
    expect(r.status).toBe(200);
    expect((await r.json() as any).sandboxID).toBe(id);
  }
  const before = gw.gateway.stats.requests;
  const r = await api("/sandboxes/doesnotexist1");
  expect(r.status).toBe(404);
  expect(await r.json()).toMatchObject({ code: 404, error_code: "gateway.sandbox_not_found" });
  expect((await api("/sandboxes/Bad-Id!")).status).toBe(404);
  expect(gw.gateway.stats.requests).toBe(before + 2);
  expect(gw.gateway.stats.nodeErrors).toBe(0);
  // timeout refresh through the gateway
  expect((await api(`/sandboxes/${ids[1]}/timeout`, { method: "POST", body: JSON.stringify({ timeout: 900 }) })).status).toBe(204);
});

test("data plane: headers, {port}-{id}.{domain} hosts (DNS-label rules), /proxy paths, WebSocket", async () => {
  for (const id of ids) {
    const h = await fetch(`${gw.url}/whoami?x=1`, { headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "49983" } });
    expect(await h.json()).toEqual({ sandbox: id, node: placed[id], port: 49983, path: "/whoami", query: "?x=1" });
    const x = await fetch(`${gw.url}/whoami`, { headers: { "x-agentenv-sandbox-id": id, "x-agentenv-sandbox-port": "8080" } });
    expect((await x.json() as any).sandbox).toBe(id);
    const host = await fetch(`${gw.url}/whoami`, { headers: { host: `8080-${id}.sbx.test` } });
    expect((await host.json() as any).sandbox).toBe(id);
    const path = await fetch(`${gw.url}/proxy/${id}/8080/whoami`);
    expect((await path.json() as any).sandbox).toBe(id);
  }
  // a 2 MiB body streams through and back
  const big = new Uint8Array(2 * 1024 * 1024).map((_, i) => i * 31);
  const echo = await fetch(`${gw.url}/echo`, { method: "POST", body: big, headers: { "e2b-sandbox-id": ids[0]!, "e2b-sandbox-port": "8080" } });
  expect(Buffer.compare(Buffer.from(await echo.arrayBuffer()), Buffer.from(big))).toBe(0);
  // host rules: a label over 63 characters or a domain not configured is not a sandbox host
  const longId = "a".repeat(60);
  expect((await fetch(`${gw.url}/whoami`, { headers: { host: `8080-${longId}.sbx.test` } })).status).toBe(401);
  expect((await fetch(`${gw.url}/whoami`, { headers: { host: `8080-${ids[0]}.other.test` } })).status).toBe(401);
  // unknown sandbox on the data plane: 502 as the E2B proxy answers; bad port header: 400
  const unknown = await fetch(`${gw.url}/whoami`, { headers: { "e2b-sandbox-id": "nosuchsandbox", "e2b-sandbox-port": "49983" } });
  expect(unknown.status).toBe(502);
  expect(await unknown.json()).toMatchObject({ sandboxId: "nosuchsandbox", code: 502 });
  expect((await fetch(`${gw.url}/x`, { headers: { "e2b-sandbox-id": ids[0]!, "e2b-sandbox-port": "99999" } })).status).toBe(400);
  // WebSocket by header and by /proxy path
  for (const [url, headers] of [
    [`${gw.url.replace("http", "ws")}/ws`, { "e2b-sandbox-id": ids[1]!, "e2b-sandbox-port": "8080" }],
    [`${gw.url.replace("http", "ws")}/proxy/${ids[2]}/8080/ws`, {}],
  ] as const) {
    const ws = new WebSocket(url, { headers } as unknown as string[]);
    const got = await new Promise<string>((resolve, reject) => {
      ws.onopen = () => ws.send("ping");
      ws.onmessage = (e) => resolve(String(e.data));
      ws.onerror = () => reject(new Error(`websocket ${url} failed`));
    });
    ws.close();
    expect(got).toBe(`${headers["e2b-sandbox-id"] ?? ids[2]}:ping`);
  }
});

test("x-agentenv-target-port (upstream AgentENV) names the port over HTTP and WebSocket; port headers that disagree are a 400 from the gateway", async () => {
  const id = ids[0]!;
  const who = async (headers: Record<string, string>) => {
    const r = await fetch(`${gw.url}/whoami`, { headers: { "x-agentenv-sandbox-id": id, ...headers } });
    return { status: r.status, source: r.headers.get("x-agentenv-error-source"), body: (await r.json()) as { port?: number; message?: string } };
  };
  expect(await who({ "x-agentenv-target-port": "8080" })).toMatchObject({ status: 200, body: { port: 8080 } });
  expect(await who({ "x-agentenv-target-port": "8080", "e2b-sandbox-port": "8080" })).toMatchObject({ status: 200, body: { port: 8080 } });
  const clash = await who({ "x-agentenv-target-port": "8080", "x-agentenv-sandbox-port": "49983" });
  expect(clash).toEqual({ status: 400, source: "gateway", body: expect.objectContaining({ code: 400, message: "conflicting sandbox ports (x-agentenv-sandbox-port: 49983, x-agentenv-target-port: 8080): name one port" }) });
  const ws = (headers: Record<string, string>) =>
    new Promise<string>((resolve, reject) => {
      const w = new WebSocket(`${gw.url.replace("http", "ws")}/ws`, { headers: { "x-agentenv-sandbox-id": id, ...headers } } as unknown as string[]);
      w.onopen = () => w.send("port?");
      w.onmessage = (e) => {
        resolve(String(e.data));
        w.close();
      };
      w.onerror = () => reject(new Error("websocket failed"));
    });
  expect(await ws({ "x-agentenv-target-port": "8080" })).toBe(`${id}:port=8080`);
  expect(await ws({})).toBe(`${id}:port=49983`);
  // a conflicting WebSocket upgrade is refused before anything is opened
  const bad = await fetch(`${gw.url}/ws`, { headers: { "x-agentenv-sandbox-id": id, "x-agentenv-target-port": "8080", "e2b-sandbox-port": "49983", upgrade: "websocket", connection: "Upgrade", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", "sec-websocket-version": "13" } });
  expect(bad.status).toBe(400);
  expect(((await bad.json()) as { message: string }).message).toBe("conflicting sandbox ports (e2b-sandbox-port: 49983, x-agentenv-target-port: 8080): name one port");
});

test("an upload through the gateway may stream for longer than request_timeout_ms while it moves; a stalled one is cut by idle_timeout_ms", async () => {
  // connect bound 200 ms, idle bound 1000 ms; the upload takes ~1.2 s in 12 chunks 100 ms apart
  const slow = startGateway(gatewayConfig(loadConfig({ env: { AENV_HOME_PATH: home, AENV_API_KEY: KEY, AENV_LOG_LEVEL: "error", AENV__gateway__addr: "127.0.0.1:0", AENV__cluster__scheduler_endpoint: `127.0.0.1:${schedPort}`, AENV__gateway__request_timeout_ms: "200", AENV__gateway__idle_timeout_ms: "1000" } })));
  const chunk = new Uint8Array(64 * 1024).map((_, i) => i * 7);
  const upload = (gapMs: (left: number) => number, chunks: number) =>
    fetch(`${slow.url}/echo`, {
      method: "POST",
      headers: { "e2b-sandbox-id": ids[0]!, "e2b-sandbox-port": "8080" },
      duplex: "half",
      body: new ReadableStream<Uint8Array>({
        async pull(c) {
          if (chunks-- === 0) return c.close();
          await Bun.sleep(gapMs(chunks));
          c.enqueue(chunk);
        },
      }),
    } as RequestInit);
  try {
    const t0 = performance.now();
    const ok = await upload(() => 100, 12);
    expect(ok.status).toBe(200);
    const got = new Uint8Array(await ok.arrayBuffer());
    expect(got.length).toBe(12 * chunk.length);
    for (let i = 0; i < 12; i++) expect(Buffer.compare(got.subarray(i * chunk.length, (i + 1) * chunk.length), chunk)).toBe(0);
    expect(performance.now() - t0).toBeGreaterThan(1000); // it did outlast the 200 ms connect bound
    // a body that stops moving for 2.5 s (> the 1 s idle bound) is cut
    const stalled = await upload((left) => (left === 1 ? 2500 : 10), 4);
    expect(stalled.status).toBe(502);
    const body = (await stalled.json()) as { sandboxId: string; code: number; message: string };
    expect(body).toEqual({ sandboxId: ids[0]!, code: 502, message: expect.stringMatching(/^the request to node [ab] \(http:\/\/127\.0\.0\.1:\d+\) was cut: the request body stalled for 1000 ms$/) });
    // a request without a body is still bounded by request_timeout_ms as a whole: the node answers in time
    expect((await fetch(`${slow.url}/whoami`, { headers: { "e2b-sandbox-id": ids[0]!, "e2b-sandbox-port": "8080" } })).status).toBe(200);
  } finally {
    await slow.close();
  }
});

test("lists across nodes: v2 filters and pagination without gaps or repeats, v1, templates, nodes", async () => {
  const all = await api("/v2/sandboxes?limit=100");
  expect(all.headers.get("x-total-running")).toBe("4");
  expect(all.headers.get("x-next-token")).toBeNull();
  const listed = (await all.json()) as { sandboxID: string; startedAt: string }[];
  expect(listed.map((s) => s.sandboxID).sort()).toEqual([...ids].sort());
  // newest first, as a node orders by default (E2B's default order)
  const times = listed.map((s) => Date.parse(s.startedAt));
  expect([...times].sort((a, b) => b - a)).toEqual(times);
  const seen: string[] = [];
  let token: string | null = null;
  let pages = 0;
  do {
    const r = await api(`/v2/sandboxes?limit=3${token ? `&nextToken=${token}` : ""}`);
    expect(r.status).toBe(200);
    const page = (await r.json()) as { sandboxID: string }[];
    seen.push(...page.map((s) => s.sandboxID));
    token = r.headers.get("x-next-token");
    pages++;
  } while (token && pages < 10);
  expect(pages).toBe(2);
  expect(seen).toEqual(listed.map((s) => s.sandboxID));
  const asc = (await (await api("/v2/sandboxes?order=asc&limit=2")).json()) as { sandboxID: string }[];
  expect(asc.map((s) => s.sandboxID)).toEqual(listed.map((s) => s.sandboxID).reverse().slice(0, 2));
  const team = (await (await api(`/v2/sandboxes?metadata=${encodeURIComponent("team=y")}`)).json()) as { sandboxID: string }[];
  expect(team.map((s) => s.sandboxID).sort()).toEqual([ids[2], ids[3]].sort());
  const bad = await api("/v2/sandboxes?limit=0");
  expect(bad.status).toBe(400);
  expect(((await (await api("/sandboxes")).json()) as unknown[]).length).toBe(4);
  const tpls = (await (await api("/templates")).json()) as { templateID: string; spawnCount: number }[];
  expect(tpls.map((t) => t.templateID).sort()).toEqual(["base", "onlyb"]);
  expect(tpls[0]!.spawnCount).toBe(4);
  const ns = (await (await api("/nodes")).json()) as { id: string; sandboxCount: number }[];
  expect(ns.map((n) => [n.id, n.sandboxCount])).toEqual([
    ["a", 2],
    ["b", 2],
  ]);
  expect((await (await api("/nodes/b")).json() as any).id).toBe("b");
  expect((await api("/nodes/zz")).status).toBe(404);
  expect((await api("/no/such/route")).status).toBe(404);
});

test("a template only one node holds: creates land there whatever Schedule picked; an unknown template is 404", async () => {
  const got: string[] = [];
  for (let i = 0; i < 2; i++) {
    const r = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "onlyb" }) });
    expect(r.status).toBe(201);
    const id = (await r.json() as any).sandboxID as string;
    got.push((await sched.client.lookupNode({ sandboxId: id })).node!.nodeId);
    expect((await api(`/sandboxes/${id}`, { method: "DELETE" })).status).toBe(204);
  }
  expect(got).toEqual(["b", "b"]);
  const missing = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "nowhere" }) });
  expect(missing.status).toBe(404);
  expect((await missing.json() as any).code).toBe(404);
  const tpls = (await (await api("/v2/templates")).json()) as { templateID: string }[];
  expect(tpls.map((t) => t.templateID).sort()).toEqual(["base", "onlyb"]);
});

test("template files: the upload URL a node hands out points at the gateway, and the PUT (no API key) reaches that node", async () => {
  const reg = await api("/v3/templates", { method: "POST", body: JSON.stringify({ name: "gwfiles" }) });
  expect(reg.status).toBe(202);
  const holder = reg.headers.get("x-agentenv-node-id")!;
  const { templateID } = (await reg.json()) as { templateID: string };
  const hash = "cd".repeat(32);
  const r = await api(`/templates/${templateID}/files/${hash}`);
  expect(r.status).toBe(201);
  expect(r.headers.get("x-agentenv-node-id")).toBe(holder);
  const up = (await r.json()) as { present: boolean; url: string };
  expect(up.present).toBe(false);
  expect(up.url.startsWith(`${gw.url}/upload/template-files/${hash}?template=${templateID}&expires=`)).toBe(true);
  const body = new Uint8Array(2 * 1024 * 1024).map((_, i) => i % 253);
  const put = await fetch(up.url, { method: "PUT", body });
  expect(put.status).toBe(201);
  expect(((await put.json()) as { bytes: number }).bytes).toBe(body.length);
  const node = nodes["ab".indexOf(holder)]!;
  expect(new Uint8Array(await Bun.file(`${node.home}/catalog/files/${hash}.tar`).arrayBuffer())).toEqual(body);
  expect(((await (await api(`/templates/${templateID}/files/${hash}`)).json()) as { present: boolean }).present).toBe(true);
  // an upload URL no GET through this gateway handed out is not guessed
  const stray = await fetch(`${gw.url}/upload/template-files/${"ef".repeat(32)}?expires=1&token=x`, { method: "PUT", body: "x" });
  expect([stray.status, ((await stray.json()) as { error_code: string }).error_code]).toEqual([404, "gateway.no_route"]);
});

test("snapshots through the gateway with the unmodified SDK: snapshot and fork on the sandbox's node, a create from a snapshot lands on the node holding it, deleteSnapshot reaches that node", async () => {
  const sdk = { apiUrl: gw.url, apiKey: KEY };
  const src = ids[0]!;
  const holderId = placed[src]!;
  const holder = nodes["ab".indexOf(holderId)]!;
  const other = nodes["ab".indexOf(holderId) ^ 1]!;
  const snap = await Sandbox.createSnapshot(src, { ...sdk, name: "gwsnap" });
  expect(snap.names).toEqual(["gwsnap"]);
  expect(holder.runtime.calls).toContain(`snapshot:${src}:user`);
  expect(holder.runtime.snapshots.list().map((x) => x.snapshotID)).toEqual([snap.snapshotId]);
  expect(other.runtime.snapshots.list()).toEqual([]);
  expect(await Sandbox.listSnapshots(sdk).nextItems()).toEqual([{ snapshotId: snap.snapshotId, names: ["gwsnap"] }]);
  // three creates: round_robin schedules at least one of them on the other node, which does not
  // hold the snapshot (404 template_not_found); the gateway then creates on the holder
  const made: string[] = [];
  const otherStarts = other.runtime.starts;
  for (const ref of [snap.snapshotId, snap.snapshotId, "gwsnap"]) {
    const s = await Sandbox.create(ref, sdk);
    made.push(s.sandboxId);
    expect(holder.runtime.started.at(-1)!.templateID).toBe(snap.snapshotId);
    expect((await sched.client.lookupNode({ sandboxId: s.sandboxId })).node!.nodeId).toBe(holderId);
    const who = await fetch(`${gw.url}/whoami`, { headers: { "e2b-sandbox-id": s.sandboxId, "e2b-sandbox-port": "8080" } });
    expect(await who.json()).toMatchObject({ sandbox: s.sandboxId, node: holderId });
  }
  expect(other.runtime.starts).toBe(otherStarts);
  // fork: the children run on the parent's node; the gateway routes them at once
  const parent = ids[1]!;
  const parentNode = nodes["ab".indexOf(placed[parent]!)]!;
  const kids = await Sandbox.fork(parent, { ...sdk, count: 2 });
  expect(kids.map((k) => k instanceof Sandbox)).toEqual([true, true]);
  for (const k of kids as Sandbox[]) {
    expect(k.sandboxDomain).toBe("sbx.test");
    expect(gw.gateway.routes.get(k.sandboxId)?.nodeId).toBe(placed[parent]!);
    const who = await fetch(`${gw.url}/whoami`, { headers: { "e2b-sandbox-id": k.sandboxId, "e2b-sandbox-port": "8080" } });
    expect(await who.json()).toMatchObject({ sandbox: k.sandboxId, node: placed[parent] });
    expect((await api(`/sandboxes/${k.sandboxId}`)).status).toBe(200);
    made.push(k.sandboxId);
  }
  expect(parentNode.runtime.calls.filter((c) => c === `snapshot:${parent}:fork`)).toHaveLength(1);
  expect(parentNode.runtime.calls.filter((c) => c.startsWith("deleteSnapshot:"))).toHaveLength(1); // the fork's checkpoint
  // deleteSnapshot (DELETE /templates/{id}) reaches the holder; a second one finds nothing
  expect(await Sandbox.deleteSnapshot(snap.snapshotId, sdk)).toBe(true);
  expect(holder.runtime.snapshots.list()).toEqual([]);
  expect(await Sandbox.deleteSnapshot(snap.snapshotId, sdk)).toBe(false);
  const gone = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: snap.snapshotId }) });
  expect([gone.status, ((await gone.json()) as { error_code: string }).error_code]).toEqual([404, "orchestrator.template_not_found"]);
  for (const id of made) expect((await api(`/sandboxes/${id}`, { method: "DELETE" })).status).toBe(204);
});

test("pause and connect through the gateway; delete unbinds", async () => {
  expect((await api(`/sandboxes/${ids[3]}/pause`, { method: "POST" })).status).toBe(204);
  expect((await (await api(`/sandboxes/${ids[3]}`)).json() as any).state).toBe("paused");
  const c = await api(`/v2/sandboxes/${ids[3]}/connect`, { method: "POST", body: JSON.stringify({ timeout: 300 }) });
  expect(c.status).toBe(201);
  expect((await c.json() as any).domain).toBe("sbx.test");
  const who = await fetch(`${gw.url}/whoami`, { headers: { "e2b-sandbox-id": ids[3]!, "e2b-sandbox-port": "8080" } });
  expect((await who.json() as any).sandbox).toBe(ids[3]);
  const extra = (await (await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base" }) })).json() as any).sandboxID as string;
  expect((await api(`/sandboxes/${extra}`, { method: "DELETE" })).status).toBe(204);
  expect((await api(`/sandboxes/${extra}`)).status).toBe(404);
});

test("scheduler down: creates answer 503, known sandboxes keep routing from the cache; back up: bindings intact", async () => {
  await sched.close();
  const c = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base" }) });
  expect(c.status).toBe(503);
  expect(await c.json()).toMatchObject({ code: 503, error_code: "gateway.scheduler_unavailable" });
  for (const id of ids) {
    expect((await api(`/sandboxes/${id}`)).status).toBe(200);
    const w = await fetch(`${gw.url}/whoami`, { headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "8080" } });
    expect((await w.json() as any).sandbox).toBe(id);
  }
  // a sandbox the gateway never saw cannot be resolved: 503, not a false 404
  expect((await api("/sandboxes/neverseen1")).status).toBe(503);
  // a list still works from the last known node list
  expect(((await (await api("/v2/sandboxes")).json()) as unknown[]).length).toBe(4);
  sched = await startTestScheduler(schedulerEnv());
  for (const id of ids) expect((await sched.client.lookupNode({ sandboxId: id })).node!.nodeId).toBe(placed[id]!);
}, 20_000);

test("a node stopped: its sandboxes answer 502 naming it (their bindings stay), the other node's keep working; it unregistered, so it leaves scheduling", async () => {
  const b = nodes[1]!;
  await b.close();
  const onB = ids.filter((id) => placed[id] === "b");
  const onA = ids.filter((id) => placed[id] === "a");
  for (const id of onB) {
    const r = await api(`/sandboxes/${id}`);
    expect(r.status).toBe(502);
    const body: any = await r.json();
    expect(body).toMatchObject({ code: 502, error_code: "gateway.node_unreachable" });
    expect(body.message).toContain("node b (");
    const d = await fetch(`${gw.url}/whoami`, { headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "8080" } });
    expect(d.status).toBe(502);
    expect((await d.json() as any).message).toContain("node b");
  }
  for (const id of onA) expect((await api(`/sandboxes/${id}`)).status).toBe(200);
  const l = await api("/v2/sandboxes");
  expect(l.headers.get("x-agentenv-unreachable-nodes")).toBe("b");
  expect(((await l.json()) as { sandboxID: string }[]).map((s) => s.sandboxID).sort()).toEqual([...onA].sort());
  // b unregistered on shutdown: UNHEALTHY at once, and every create goes to a
  expect((await sched.client.getNode({ nodeId: "b", clusterId: "" })).node!.snapshot!.status).toBe(NodeStatus.NODE_STATUS_UNHEALTHY);
  const startsOnA = nodes[0]!.runtime.starts;
  for (let i = 0; i < 3; i++) {
    const c = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base" }) });
    expect([c.status, c.headers.get("x-agentenv-node-id")]).toEqual([201, "a"]);
  }
  expect(nodes[0]!.runtime.starts).toBe(startsOnA + 3);
  const m = await (await api("/metrics", { key: null })).text();
  expect(m).toMatch(/^agentenv_gateway_node_errors_total [1-9]\d*$/m);
  expect(m).toMatch(/^agentenv_gateway_scheduler_errors_total [1-9]\d*$/m);
  expect(m).toMatch(/^agentenv_gateway_route_cache_entries \d+$/m);
}, 20_000);
