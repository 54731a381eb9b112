/**
 * The gateway in front of nodes that misbehave, with a real scheduler (SQLite in memory, static
 * discovery) and the real gateway on 127.0.0.1. The nodes are stand-ins (Bun.serve) that count
 * every request they get: one that accepts and never answers (hung), one that sends headers and
 * "[" and then stalls, one that answers like a node, and addresses nobody listens on (refused).
 * Each test starts its own scheduler and gateway over the nodes it names.
 */
import { afterAll, afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import type { Server } from "bun";
import { loadConfig } from "../../../src/config/index.ts";
import { gatewayConfig, startGateway, type RunningGateway } from "../../../services/gateway/index.ts";
import { beat, freePort, startTestScheduler } from "../helpers.ts";
import { waitFor } from "../../helpers/wait.ts";

const KEY = "e2b_" + "cd".repeat(20);
/** The gateway's request_timeout_ms (and response_timeout_ms): what a hung node costs; the answering stand-ins take ~1 ms. */
const TIMEOUT_MS = 1500;
const home = mkdtempSync("/tmp/aenv-gw-faults-");
afterAll(() => rmSync(home, { recursive: true, force: true }));
const cleanup: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/** A stand-in node: `seen` lists "METHOD /path?query" of every request it got. */
interface FakeNode {
  url: string;
  seen: string[];
}

type Behaviour = "hung" | "stall" | ((req: Request, url: URL) => Response | Promise<Response>);

function fakeNode(behaviour: Behaviour): FakeNode {
  const seen: string[] = [];
  const server: Server<undefined> = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0,
    fetch(req) {
      const u = new URL(req.url);
      seen.push(`${req.method} ${u.pathname}${u.search}`);
      if (behaviour === "hung") return new Promise<Response>(() => {});
      if (behaviour === "stall") {
        const body = new ReadableStream<Uint8Array>({ start: (c) => c.enqueue(new TextEncoder().encode("[")) });
        return new Response(body, { headers: { "content-type": "application/json" } });
      }
      return behaviour(req, u);
    },
  });
  cleanup.push(() => server.stop(true));
  return { url: `http://127.0.0.1:${server.port}`, seen };
}

/** A node that answers like one: lists, templates, creates (ids `<name>s<n>`). */
function goodNode(name: string, o: { templates?: { templateID: string; aliases: string[] }[] } = {}): FakeNode {
  let n = 0;
  return fakeNode(async (req, u) => {
    if (req.method === "POST" && u.pathname === "/v2/sandboxes") {
      await req.arrayBuffer();
      return Response.json({ sandboxID: `${name}s${++n}`, templateID: "base", clientID: name, envdVersion: "0.5.7", domain: null }, { status: 201 });
    }
    if (u.pathname === "/v2/sandboxes" || u.pathname === "/sandboxes") return Response.json([{ sandboxID: `${name}old`, startedAt: "2026-01-01T00:00:00.000Z", state: "running" }]);
    if (u.pathname === "/templates" && req.method === "GET") return Response.json((o.templates ?? []).map((t) => ({ ...t, spawnCount: 0, buildCount: 1 })));
    const alias = /^\/templates\/aliases\/(.+)$/.exec(u.pathname);
    if (alias) {
      const t = (o.templates ?? []).find((x) => x.aliases.includes(alias[1]!));
      return t ? Response.json({ templateID: t.templateID, public: false }) : Response.json({ code: 404, message: "no such alias", error_code: "template.not_found" }, { status: 404 });
    }
    const tpl = /^\/templates\/([^/]+)$/.exec(u.pathname);
    if (tpl && req.method === "DELETE") return new Response(null, { status: 204 });
    if (u.pathname === "/nodes") return Response.json([{ id: name, nodeID: name, status: "ready" }]);
    if (u.pathname === "/snapshots") return Response.json([]);
    return Response.json({ code: 404, message: "not here", error_code: "api.no_route" }, { status: 404 });
  });
}

/** A URL nobody listens on (connection refused). */
const refused = () => `http://127.0.0.1:${freePort()}`;

/** A scheduler over `nodes` and a gateway in front of it. */
async function cluster(nodes: Record<string, string>, env: { scheduler?: Record<string, string>; gateway?: Record<string, string> } = {}) {
  const sched = await startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__db_path: ":memory:", AENV__scheduler__nodes: Object.entries(nodes).map(([id, url]) => `${id}=${url}`).join(","), ...env.scheduler });
  cleanup.push(() => sched.close());
  const gw: RunningGateway = startGateway(
    gatewayConfig(
      loadConfig({
        env: {
          AENV_HOME_PATH: home,
          AENV_API_KEY: KEY,
          AENV_LOG_LEVEL: "silent",
          AENV__gateway__addr: "127.0.0.1:0",
          AENV__cluster__scheduler_endpoint: `127.0.0.1:${sched.port}`,
          AENV__gateway__request_timeout_ms: String(TIMEOUT_MS),
          // sandbox traffic waits response_timeout_ms for an answer (5 min by default)
          AENV__gateway__response_timeout_ms: String(TIMEOUT_MS),
          AENV__gateway__node_list_ttl_ms: "0",
          ...env.gateway,
        },
      }),
    ),
  );
  cleanup.push(() => gw.close());
  const api = (path: string, init: RequestInit = {}) => fetch(gw.url + path, { ...init, headers: { "x-api-key": KEY, ...(typeof init.body === "string" ? { "content-type": "application/json" } : {}), ...(init.headers as Record<string, string>) } });
  return { sched, gw, api };
}

test("an unknown sandbox id is 404 without any node being asked", async () => {
  const a = goodNode("a");
  const b = goodNode("b");
  const { api } = await cluster({ a: a.url, b: b.url });
  for (const id of ["doesnotexist1", "Bad-Id!"]) {
    const r = await api(`/sandboxes/${id}`);
    expect(r.status).toBe(404);
    expect(await r.json()).toMatchObject({ code: 404, error_code: "gateway.sandbox_not_found" });
  }
  expect([a.seen, b.seen]).toEqual([[], []]);
});

test("a node that accepts and never answers: control plane and data plane 502 naming it, a list leaves it out, a WebSocket closes 1011 naming it", async () => {
  const hung = fakeNode("hung");
  const good = goodNode("good");
  const { api, gw, sched } = await cluster({ hung: hung.url, good: good.url });
  await sched.client.recordAssignment({ sandboxId: "onhung1", node: { nodeId: "hung", endpoint: "" } });
  // all four at once: each waits request_timeout_ms for the hung node
  const [c, d, l, closed] = await Promise.all([
    api("/sandboxes/onhung1"),
    fetch(`${gw.url}/x`, { headers: { "e2b-sandbox-id": "onhung1", "e2b-sandbox-port": "8080" } }),
    api("/v2/sandboxes"),
    new Promise<{ code: number; reason: string; opened: boolean }>((resolve) => {
      const ws = new WebSocket(`${gw.url.replace("http", "ws")}/ws`, { headers: { "e2b-sandbox-id": "onhung1", "e2b-sandbox-port": "8080" } } as unknown as string[]);
      let opened = false;
      ws.onopen = () => (opened = true);
      ws.onclose = (e) => resolve({ code: e.code, reason: e.reason, opened });
    }),
  ]);
  expect(c.status).toBe(502);
  expect(await c.json()).toMatchObject({ error_code: "gateway.node_unreachable", message: `node hung (${hung.url}) is unreachable: no answer within ${TIMEOUT_MS} ms` });
  expect(d.status).toBe(502);
  expect(((await d.json()) as { message: string }).message).toContain(`node hung (${hung.url}) is unreachable: no answer within ${TIMEOUT_MS} ms`);
  expect(l.status).toBe(200);
  expect(l.headers.get("x-agentenv-unreachable-nodes")).toBe("hung");
  expect(((await l.json()) as { sandboxID: string }[]).map((s) => s.sandboxID)).toEqual(["goodold"]);
  // the client's socket was upgraded at once; the gateway closes it when the node's never opens
  expect(closed).toEqual({ code: 1011, reason: `node hung (${hung.url}) is unreachable: not open within ${TIMEOUT_MS} ms`, opened: true });
  expect([...hung.seen].sort()).toEqual(["GET /sandboxes/onhung1", "GET /v2/sandboxes", "GET /ws", "GET /x"]);
});

test("a WebSocket to a node refusing connections closes 1011 naming the node", async () => {
  const url = refused();
  const { gw, sched } = await cluster({ down: url });
  await sched.client.recordAssignment({ sandboxId: "ondown1", node: { nodeId: "down", endpoint: "" } });
  const closed = await new Promise<{ code: number; reason: string }>((resolve) => {
    const ws = new WebSocket(`${gw.url.replace("http", "ws")}/proxy/ondown1/8080/ws`);
    ws.onclose = (e) => resolve({ code: e.code, reason: e.reason });
  });
  expect(closed).toEqual({ code: 1011, reason: `node down (${url}) is unreachable` });
});

test("a node that sends headers and then stalls: a list answers without it, 502 when it is the only node", async () => {
  const stall = fakeNode("stall");
  const good = goodNode("good");
  const both = await cluster({ good: good.url, stall: stall.url });
  const only = await cluster({ stall: stall.url });
  const paths = ["/v2/sandboxes", "/sandboxes", "/templates", "/snapshots"];
  const [alone, ...lists] = await Promise.all([only.api("/v2/sandboxes"), ...paths.map((p) => both.api(p))]);
  expect(lists.map((r, i) => [paths[i], r.status, r.headers.get("x-agentenv-unreachable-nodes")])).toEqual(paths.map((p) => [p, 200, "stall"]));
  expect(alone!.status).toBe(502);
  const body = (await alone!.json()) as { error_code: string; message: string };
  expect(body.error_code).toBe("gateway.node_unreachable");
  expect(body.message).toContain(`node stall (${stall.url}) is unreachable: its answer to /v2/sandboxes? broke off: no complete answer within ${TIMEOUT_MS} ms`);
});

test("node answers the gateway reads whole are bounded and checked: a list past max_answer_bytes or of the wrong shape leaves its node out, a create answer that is not a Sandbox is 502", async () => {
  const big = fakeNode(() => Response.json(Array.from({ length: 400 }, (_, i) => ({ sandboxID: `big${i}`, startedAt: "2026-01-01T00:00:00.000Z", pad: "p".repeat(40) }))));
  const odd = fakeNode((req, u) => (u.pathname === "/v2/sandboxes" && req.method === "POST" ? Response.json({ id: "not-a-sandbox" }, { status: 201 }) : Response.json([{ sandboxID: 7, startedAt: "x" }])));
  const good = goodNode("good");
  const { api } = await cluster({ big: big.url, good: good.url, odd: odd.url }, { gateway: { AENV__gateway__max_answer_bytes: "4096" } });
  const r = await api("/v2/sandboxes");
  expect(r.status).toBe(200);
  expect(r.headers.get("x-agentenv-unreachable-nodes")).toBe("big,odd");
  expect(((await r.json()) as { sandboxID: string }[]).map((s) => s.sandboxID)).toEqual(["goodold"]);
  // alone, each is named with what was wrong
  for (const [url, why] of [
    [big.url, "its answer to /v2/sandboxes? exceeds 4096 bytes ([gateway] max_answer_bytes)"],
    [odd.url, "it answered /v2/sandboxes? with a body the API does not return (HTTP 200): /0/sandboxID: Expected string"],
  ] as const) {
    const one = await cluster({ n: url }, { gateway: { AENV__gateway__max_answer_bytes: "4096" } });
    const a = await one.api("/v2/sandboxes");
    expect(a.status).toBe(502);
    expect(((await a.json()) as { message: string }).message).toContain(`node n (${url}) is unreachable: ${why}`);
  }
  const created = await (await cluster({ odd: odd.url })).api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base" }) });
  expect(created.status).toBe(502);
  expect(await created.json()).toMatchObject({ error_code: "gateway.node_unreachable", message: `node odd (${odd.url}) is unreachable: it answered a create with a body the API does not return (HTTP 201): /sandboxID: Expected required property` });
});

test("every node unreachable: sandbox, template and snapshot lists fail 502 naming them instead of an empty 200", async () => {
  const u1 = refused();
  const u2 = refused();
  const { api } = await cluster({ x: u1, y: u2 });
  for (const path of ["/v2/sandboxes", "/sandboxes", "/templates", "/snapshots"]) {
    const r = await api(path);
    const body = (await r.json()) as { error_code: string; message: string };
    expect([path, r.status, body.error_code]).toEqual([path, 502, "gateway.node_unreachable"]);
    expect(body.message).toContain(`node x (${u1}) is unreachable: connection refused`);
    expect(body.message).toContain(`node y (${u2}) is unreachable: connection refused`);
  }
});

test("nodes the scheduler reports UNHEALTHY are not asked by lists, and are named as left out", async () => {
  const sick = fakeNode("hung");
  const good = goodNode("good");
  const { api, sched } = await cluster({ good: good.url, sick: sick.url });
  await sched.client.heartbeat(beat("sick", []));
  await sched.client.unregisterNode({ nodeId: "sick", serviceInstanceId: "sick-1" });
  const r = await api("/v2/sandboxes");
  expect(r.status).toBe(200);
  expect(r.headers.get("x-agentenv-unreachable-nodes")).toBe("sick");
  const ns = (await (await api("/nodes")).json()) as { id: string; status: string; message?: string }[];
  expect(ns.map((n) => [n.id, n.status])).toEqual([
    ["good", "ready"],
    ["sick", "unhealthy"],
  ]);
  expect(ns[1]!.message).toContain("the scheduler reports it UNHEALTHY");
  expect(sick.seen).toEqual([]);
});

test("creates skip a node that unregistered (least_loaded), and a refused node Schedule keeps naming", async () => {
  const busy = goodNode("busy");
  const { api, sched } = await cluster({ busy: busy.url, gone: refused() }, { scheduler: { AENV__scheduler__strategy: "least_loaded" } });
  await sched.client.heartbeat(beat("busy", ["x1", "x2", "x3"]));
  await sched.client.heartbeat(beat("gone", [], { instance: "gone-1" }));
  // gone is empty, so least_loaded prefers it, and it refuses connections
  const first = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base" }) });
  expect([first.status, ((await first.json()) as { sandboxID: string }).sandboxID]).toEqual([201, "busys1"]);
  // its process stopped and unregistered: never scheduled again
  await sched.client.unregisterNode({ nodeId: "gone", serviceInstanceId: "gone-1" });
  for (let i = 2; i <= 3; i++) {
    const r = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base" }) });
    expect([r.status, ((await r.json()) as { sandboxID: string }).sandboxID]).toEqual([201, `busys${i}`]);
    expect((await sched.client.lookupNode({ sandboxId: `busys${i}` })).node!.nodeId).toBe("busy");
  }
  expect(busy.seen.filter((s) => s.startsWith("POST"))).toEqual(["POST /v2/sandboxes", "POST /v2/sandboxes", "POST /v2/sandboxes"]);
});

test("no schedulable node: a create answers 503 no_nodes after one Schedule call (not retried for scheduler_timeout_ms)", async () => {
  const { api, sched } = await cluster({ a: refused() }, { gateway: { AENV__gateway__scheduler_timeout_ms: "60000" } });
  await sched.client.unregisterNode({ nodeId: "a", serviceInstanceId: "" });
  let calls = 0;
  const orig = sched.core.schedule.bind(sched.core);
  sched.core.schedule = () => (calls++, orig());
  const r = await api("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base" }) });
  expect(r.status).toBe(503);
  expect(await r.json()).toMatchObject({ error_code: "gateway.no_nodes", message: expect.stringContaining("no schedulable node") });
  expect(calls).toBe(1);
});

test("malformed percent-encoding in a path is 400, not 500", async () => {
  const { api } = await cluster({ a: goodNode("a").url });
  for (const path of ["/sandboxes/%E0%A4%A", "/v2/sandboxes/%zz/logs", "/templates/%zz", "/templates/aliases/%E0%A4%A", "/nodes/%zz"]) {
    const r = await api(path);
    const body = (await r.json()) as { error_code: string; message: string };
    expect([path, r.status, body.error_code]).toEqual([path, 400, "gateway.bad_request"]);
    expect(body.message).toContain("malformed percent-encoding");
  }
});

test("GET /templates/aliases/{alias} is answered by the node that knows the alias; unknown everywhere → the nodes' 404", async () => {
  const a = goodNode("a", { templates: [{ templateID: "t1", aliases: ["one"] }] });
  const b = goodNode("b", { templates: [{ templateID: "t2", aliases: ["two"] }] });
  const { api } = await cluster({ a: a.url, b: b.url });
  const two = await api("/templates/aliases/two");
  expect([two.status, two.headers.get("x-agentenv-node-id"), await two.json()]).toEqual([200, "b", { templateID: "t2", public: false }]);
  const none = await api("/templates/aliases/nothing");
  expect(none.status).toBe(404);
  expect(((await none.json()) as { error_code: string }).error_code).toBe("template.not_found");
});

test("DELETE of a template several nodes hold reaches every one of them", async () => {
  const a = goodNode("a", { templates: [{ templateID: "shared", aliases: [] }] });
  const b = goodNode("b", { templates: [{ templateID: "shared", aliases: [] }] });
  const c = goodNode("c", { templates: [{ templateID: "other", aliases: [] }] });
  const { api } = await cluster({ a: a.url, b: b.url, c: c.url });
  expect((await api("/templates/shared", { method: "DELETE" })).status).toBe(204);
  const deletes = (n: FakeNode) => n.seen.filter((s) => s.startsWith("DELETE"));
  expect([deletes(a), deletes(b), deletes(c)]).toEqual([["DELETE /templates/shared"], ["DELETE /templates/shared"], []]);
});

/** Send raw HTTP/1.1 `head` to the gateway; the answer's head (status line and headers), lowercased. */
async function rawHead(gwUrl: string, head: string): Promise<string> {
  let answer = "";
  const done = Promise.withResolvers<void>();
  const sock = await Bun.connect({
    hostname: "127.0.0.1",
    port: Number(new URL(gwUrl).port),
    socket: {
      data(_s, d) {
        answer += new TextDecoder().decode(d);
        if (answer.includes("\r\n\r\n")) done.resolve();
      },
      close: () => done.resolve(),
    },
  });
  sock.write(head);
  await done.promise;
  sock.end();
  return answer.slice(0, answer.indexOf("\r\n\r\n")).toLowerCase();
}

test("scheduler down: a WebSocket for a sandbox the gateway does not know is refused 503, marked as the gateway's own answer", async () => {
  const { gw, sched } = await cluster({ a: goodNode("a").url }, { gateway: { AENV__gateway__scheduler_timeout_ms: "300" } });
  await sched.close();
  const head = await rawHead(gw.url, "GET /ws HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\ne2b-sandbox-id: unseen1\r\ne2b-sandbox-port: 8080\r\n\r\n");
  expect(head).toStartWith("http/1.1 503");
  expect(head).toContain("x-agentenv-error-source: gateway");
});

test("a chunked control-plane body is cut at max_body_bytes: 413 before the client has sent it all", async () => {
  const { gw } = await cluster({ a: goodNode("a").url }, { gateway: { AENV__gateway__max_body_bytes: "65536" } });
  const total = 64 * 1024 * 1024;
  const chunk = new Uint8Array(64 * 1024).fill(0x20);
  const port = Number(new URL(gw.url).port);
  let answer = "";
  let sent = 0;
  const sock = await Bun.connect({
    hostname: "127.0.0.1",
    port,
    socket: {
      data(_s, d) {
        answer += new TextDecoder().decode(d);
      },
    },
  });
  sock.write(`POST /v2/sandboxes HTTP/1.1\r\nhost: x\r\nx-api-key: ${KEY}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n`);
  const frame = new Uint8Array([...new TextEncoder().encode(`${chunk.length.toString(16)}\r\n`), ...chunk, 13, 10]);
  while (sent < total && !answer.includes("\r\n\r\n")) {
    let off = 0;
    while (off < frame.length) {
      const n = sock.write(frame.subarray(off));
      if (n <= 0) await Bun.sleep(1);
      off += Math.max(0, n);
      if (answer.includes("\r\n\r\n")) break;
    }
    sent += chunk.length;
  }
  await waitFor("the gateway's whole 413 answer", () => answer.includes("}"), { timeoutMs: 2000 });
  sock.end();
  expect(answer).toStartWith("HTTP/1.1 413");
  expect(answer).toContain('"error_code":"gateway.body_too_large"');
  expect(sent).toBeLessThan(total);
});

test("a sandbox's events come from the node that knows it even when another node fails (500) that read", async () => {
  const event = { id: "e1", type: "sandbox.lifecycle.created", timestamp: "2026-01-01T00:00:00.000Z", sandboxId: "sbx1" };
  // the failing node first and last in the node list: the answer must not depend on the order
  for (const brokenFirst of [true, false]) {
    const broken = fakeNode((_req, u) => (u.pathname.startsWith("/events/") ? Response.json({ code: 500, message: "database is locked" }, { status: 500 }) : Response.json([])));
    const knows = fakeNode((_req, u) =>
      u.pathname === "/events/sandboxes/sbx1" ? Response.json([event]) : Response.json({ code: 404, message: "not here" }, { status: 404 }),
    );
    const { api } = await cluster(brokenFirst ? { a: broken.url, b: knows.url } : { a: knows.url, b: broken.url });
    const r = await api("/events/sandboxes/sbx1");
    expect({ brokenFirst, status: r.status, body: await r.json() }).toEqual({ brokenFirst, status: 200, body: [event] });
    for (const f of cleanup.splice(0).reverse()) await f();
  }
});
