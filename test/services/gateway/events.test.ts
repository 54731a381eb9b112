/**
 * Lifecycle events and webhooks through the gateway (issue 29 item 4), with the real parts: a
 * scheduler (SQLite, static discovery), two nodes (API, orchestrator, SQLite, delivery lanes;
 * sandboxes are loopback guests) and the gateway, driven by the e2b@2.51.0 SDK and HTTP, and a
 * receiver in this test checking E2B's signature. One registration at the gateway reaches both
 * nodes: the sandboxes of both are delivered.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { Sandbox } from "e2b";
import { loadConfig } from "../../../src/config/index.ts";
import type { SandboxLifecycleEvent } from "../../../src/events/index.ts";
import { gatewayConfig, startGateway, type RunningGateway } from "../../../services/gateway/index.ts";
import { freePort, startLoopbackNode, startTestScheduler, webhookReceiver, type ReceivedEvent } from "../helpers.ts";
import { waitFor as wait } from "../../helpers/wait.ts";

const KEY = "e2b_" + "cd".repeat(20);
const home = mkdtempSync("/tmp/aenv-gw-ev-");
let sched: Awaited<ReturnType<typeof startTestScheduler>>;
let nodes: Awaited<ReturnType<typeof startLoopbackNode>>[];
let gw: RunningGateway;
let got: ReceivedEvent[] = [];
let rx: ReturnType<typeof webhookReceiver>;

const call = (base: string, path: string, init: RequestInit = {}) => fetch(base + path, { ...init, headers: { "x-api-key": KEY, ...(init.body ? { "content-type": "application/json" } : {}) } });
const gwCall = (path: string, init: RequestInit = {}) => call(gw.url, path, init);
const sig = (secret: string, raw: string) => createHash("sha256").update(secret + raw).digest("base64url");

beforeAll(async () => {
  const port = freePort();
  const env = { AENV__events__webhook_retry_initial_ms: "100", AENV__events__webhook_retry_max_ms: "500" };
  nodes = [await startLoopbackNode("a", port, KEY, env), await startLoopbackNode("b", port, KEY, env)];
  sched = await startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__addr: `127.0.0.1:${port}`, AENV__scheduler__nodes: nodes.map((n, i) => `${"ab"[i]}=${n.url}`).join(","), AENV__scheduler__report_ttl_secs: "2" });
  gw = startGateway(gatewayConfig(loadConfig({ env: { AENV_HOME_PATH: home, AENV_API_KEY: KEY, AENV_LOG_LEVEL: "error", AENV__gateway__addr: "127.0.0.1:0", AENV__cluster__scheduler_endpoint: `127.0.0.1:${port}`, AENV__gateway__request_timeout_ms: "5000" } })));
  rx = webhookReceiver();
  got = rx.got;
});

afterAll(async () => {
  rx?.stop();
  await gw?.close();
  await sched?.close();
  for (const n of nodes ?? []) await n.dispose();
  rmSync(home, { recursive: true, force: true });
});

/** `cond` true within `ms` (the shared wait, with this file's default bound). */
const waitFor = (what: string, cond: () => boolean | Promise<boolean>, ms = 20_000) => wait(what, cond, { timeoutMs: ms });

test("one webhook registered at the gateway is on every node and receives the events of sandboxes on both; reads merge the nodes; patch and delete reach every node", async () => {
  const secret = "cluster-secret";
  const reg = await gwCall("/events/webhooks", { method: "POST", body: JSON.stringify({ name: "all", url: `http://127.0.0.1:${rx.port}/`, events: ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"], signatureSecret: secret }) });
  expect(reg.status).toBe(201);
  const hook = (await reg.json()) as { id: string; name: string };
  expect(reg.headers.get("x-agentenv-unreachable-nodes")).toBeNull();
  for (const n of nodes) expect(((await (await call(n.url, `/events/webhooks/${hook.id}`)).json()) as { name: string }).name).toBe("all");
  expect(((await (await gwCall("/events/webhooks")).json()) as { id: string }[]).map((w) => w.id)).toEqual([hook.id]);

  // sandboxes on both nodes, through the gateway (the scheduler spreads them)
  const opts = { apiUrl: gw.url, apiKey: KEY, sandboxUrl: gw.url };
  const ids: string[] = [];
  for (let i = 0; i < 6 && nodes.some((n) => n.orch.inStates(["running"]).length === 0); i++) ids.push((await Sandbox.create("base", opts)).sandboxId);
  expect(nodes.map((n) => n.orch.inStates(["running"]).length > 0)).toEqual([true, true]);
  for (const id of ids) await Sandbox.kill(id, opts);
  await waitFor("created + killed of each sandbox", () => ids.every((id) => got.filter((g) => g.event.sandboxId === id).length >= 2));
  for (const id of ids) expect(got.filter((g) => g.event.sandboxId === id).map((g) => g.event.type)).toEqual(["sandbox.lifecycle.created", "sandbox.lifecycle.killed"]);
  for (const g of got) expect(g.sig).toBe(sig(secret, g.raw));

  // reads through the gateway: one sandbox's events from its node; all of them merged by time; the feed's cursor per node
  for (const id of ids) expect(((await (await gwCall(`/events/sandboxes/${id}?orderAsc=true`)).json()) as SandboxLifecycleEvent[]).map((e) => e.type)).toEqual(["sandbox.lifecycle.created", "sandbox.lifecycle.killed"]);
  expect((await gwCall("/events/sandboxes/nosuchsandbox")).status).toBe(404);
  const all = (await (await gwCall("/events/sandboxes?limit=100&orderAsc=true")).json()) as SandboxLifecycleEvent[];
  expect(all.length).toBe(ids.length * 2);
  const ts = all.map((e) => Date.parse(e.timestamp));
  expect([...ts].sort((a, b) => a - b)).toEqual(ts);
  const newest = (await (await gwCall("/events/sandboxes?limit=3")).json()) as SandboxLifecycleEvent[];
  expect(newest.map((e) => e.id)).toEqual([...all].reverse().slice(0, 3).map((e) => e.id));
  const feed = await gwCall("/events/sandboxes?cursor=&limit=100");
  expect(((await feed.json()) as SandboxLifecycleEvent[]).map((e) => e.id).sort()).toEqual(all.map((e) => e.id).sort());
  const after = await gwCall(`/events/sandboxes?cursor=${feed.headers.get("x-next-cursor")}&limit=100`);
  expect(await after.json()).toEqual([]);
  expect((await gwCall("/events/sandboxes?cursor=notours")).status).toBe(400);

  // the delivery log merges both nodes' deliveries
  const log = (await (await gwCall(`/events/webhooks/${hook.id}/deliveries?limit=100`)).json()) as { data: { eventId: string; attempts: { status: string }[] }[] };
  expect(log.data.map((d) => d.eventId).sort()).toEqual(all.map((e) => e.id).sort());
  for (const d of log.data) expect(d.attempts.map((a) => a.status)).toEqual(["success"]);

  // patch and delete reach every node; a bad field is refused as the nodes refuse it
  const patched = await gwCall(`/events/webhooks/${hook.id}`, { method: "PATCH", body: JSON.stringify({ name: "renamed" }) });
  expect(patched.status).toBe(200);
  for (const n of nodes) expect(((await (await call(n.url, `/events/webhooks/${hook.id}`)).json()) as { name: string }).name).toBe("renamed");
  const bad = await gwCall(`/events/webhooks/${hook.id}`, { method: "PATCH", body: JSON.stringify({ url: "ftp://x" }) });
  expect([bad.status, ((await bad.json()) as { error_code: string }).error_code]).toEqual([400, "events.bad_request"]);
  const unknown = await gwCall("/events/webhooks", { method: "POST", body: JSON.stringify({ name: "x", url: "http://a/", events: ["sandbox.lifecycle.created"], signatureSecret: "s", extra: 1 }) });
  expect([unknown.status, ((await unknown.json()) as { error_code: string }).error_code]).toEqual([400, "api.unknown_field"]);
  expect((await gwCall(`/events/webhooks/${hook.id}`, { method: "DELETE" })).status).toBe(200);
  for (const n of nodes) expect((await call(n.url, `/events/webhooks/${hook.id}`)).status).toBe(404);
  expect((await gwCall(`/events/webhooks/${hook.id}`)).status).toBe(404);
  expect((await gwCall(`/events/webhooks/${hook.id}`, { method: "DELETE" })).status).toBe(404);
});
