/**
 * Webhooks registered at the gateway reach nodes that were not there at registration time
 * (issue 29: one registration reaches every node). Real parts: a scheduler (SQLite, static
 * discovery naming two nodes), the gateway, nodes (API, orchestrator, SQLite, delivery lanes;
 * sandboxes are loopback guests) started and stopped by the test, and a receiver checking E2B's
 * signature. The registration is made while only node a runs; the gateway is restarted on its
 * data directory; node b then starts and is given the webhook, and its sandbox's events reach
 * the receiver; a delete made while b is stopped reaches b when it is back.
 */
import { afterAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../../src/config/index.ts";
import { gatewayConfig, GatewayError, startGateway, type RunningGateway } from "../../../services/gateway/index.ts";
import { MAX_TOMBSTONES, WebhookRegistry } from "../../../services/gateway/webhook-registry.ts";
import { freePort, startLoopbackNode, startTestScheduler, webhookReceiver } from "../helpers.ts";
import { waitFor } from "../../helpers/wait.ts";

const KEY = "e2b_" + "ef".repeat(20);
const cleanup: (() => Promise<unknown> | unknown)[] = [];
afterAll(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const call = (base: string, path: string, init: RequestInit = {}) => fetch(base + path, { ...init, headers: { "x-api-key": KEY, ...(init.body ? { "content-type": "application/json" } : {}) } });
const sig = (secret: string, raw: string) => createHash("sha256").update(secret + raw).digest("base64url");

test("a webhook registered on a one-node cluster reaches a node that joins later (after a gateway restart): its sandbox's events are delivered; a delete reaches a node that was away", async () => {
  const home = mkdtempSync("/tmp/aenv-gw-sync-");
  cleanup.push(() => rmSync(home, { recursive: true, force: true }));
  const schedPort = freePort();
  const portB = freePort();
  const homeB = mkdtempSync("/tmp/aenv-gw-sync-b-");
  cleanup.push(() => rmSync(homeB, { recursive: true, force: true }));
  const a = await startLoopbackNode("a", schedPort, KEY);
  cleanup.push(() => a.dispose());
  const urlB = `http://127.0.0.1:${portB}`;
  const sched = await startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__addr: `127.0.0.1:${schedPort}`, AENV__scheduler__nodes: `a=${a.url},b=${urlB}`, AENV__scheduler__report_ttl_secs: "2" });
  cleanup.push(() => sched.close());
  const gateway = () =>
    startGateway(
      gatewayConfig(
        loadConfig({
          env: {
            AENV_HOME_PATH: home,
            AENV_API_KEY: KEY,
            AENV_LOG_LEVEL: "error",
            AENV__gateway__addr: "127.0.0.1:0",
            AENV__cluster__scheduler_endpoint: `127.0.0.1:${schedPort}`,
            AENV__gateway__request_timeout_ms: "5000",
            AENV__gateway__node_list_ttl_ms: "100",
            AENV__gateway__webhook_sync_interval_ms: "100",
          },
        }),
      ),
    );
  let gw: RunningGateway = gateway();
  cleanup.push(() => gw.close());
  /** Node b, on its own data directory (kept across its restarts) and port. */
  const startB = async () => {
    const b = await startLoopbackNode("b", schedPort, KEY, { AENV_HOME_PATH: homeB, AENV_RUNTIME_PATH: join(homeB, "run"), AENV_API_ADDR: `127.0.0.1:${portB}` });
    // its own temporary home goes unused (AENV_HOME_PATH names homeB)
    cleanup.push(() => rmSync(b.home, { recursive: true, force: true }), () => b.close());
    return b;
  };
  const rx = webhookReceiver();
  cleanup.push(() => rx.stop());
  const got = rx.got;

  // registered while only a runs: b is named as not reached
  const secret = "joined-later";
  const reg = await call(gw.url, "/events/webhooks", { method: "POST", body: JSON.stringify({ name: "late", url: `http://127.0.0.1:${rx.port}/`, events: ["sandbox.lifecycle.created"], signatureSecret: secret }) });
  expect(reg.status).toBe(201);
  expect(reg.headers.get("x-agentenv-unreachable-nodes")).toBe("b");
  const hook = (await reg.json()) as { id: string };
  expect((await call(a.url, `/events/webhooks/${hook.id}`)).status).toBe(200);
  // kept in the gateway's data directory, readable by its owner only (it holds the secret)
  const file = join(home, "gateway-webhooks.json");
  expect(statSync(file).mode & 0o777).toBe(0o600);
  expect((JSON.parse(readFileSync(file, "utf8")) as { webhooks: { id: string; body: { signatureSecret: string } }[] }).webhooks.map((w) => [w.id, w.body.signatureSecret])).toEqual([[hook.id, secret]]);

  // a new gateway process on the same data directory knows it
  await gw.close();
  gw = gateway();

  // b joins: the gateway gives it the webhook (same id), and b's sandboxes are delivered
  let b = await startB();
  await waitFor("node b to hold the webhook", async () => (await call(b.url, `/events/webhooks/${hook.id}`)).status === 200, { timeoutMs: 20_000 });
  expect(((await (await call(b.url, `/events/webhooks/${hook.id}`)).json()) as { name: string; events: string[] })).toMatchObject({ name: "late", events: ["sandbox.lifecycle.created"] });
  const created = await call(b.url, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", timeout: 60 }) });
  expect(created.status).toBe(201);
  const onB = ((await created.json()) as { sandboxID: string }).sandboxID;
  await waitFor("the created event of b's sandbox at the receiver", () => got.some((g) => g.event.sandboxId === onB), { timeoutMs: 20_000 });
  const delivered = got.filter((g) => g.event.sandboxId === onB);
  expect(delivered.map((g) => g.event.type)).toEqual(["sandbox.lifecycle.created"]);
  expect(delivered[0]!.sig).toBe(sig(secret, delivered[0]!.raw));

  // a change reaches both; a delete made while b is stopped reaches b when it is back
  expect((await call(gw.url, `/events/webhooks/${hook.id}`, { method: "PATCH", body: JSON.stringify({ name: "renamed" }) })).status).toBe(200);
  for (const n of [a, b]) expect(((await (await call(n.url, `/events/webhooks/${hook.id}`)).json()) as { name: string }).name).toBe("renamed");
  await b.close();
  const del = await call(gw.url, `/events/webhooks/${hook.id}`, { method: "DELETE" });
  expect([del.status, del.headers.get("x-agentenv-unreachable-nodes")]).toEqual([200, "b"]);
  expect((await call(a.url, `/events/webhooks/${hook.id}`)).status).toBe(404);
  b = await startB();
  await waitFor("the delete to reach node b", async () => (await call(b.url, `/events/webhooks/${hook.id}`)).status === 404, { timeoutMs: 20_000 });
  expect((await (await call(gw.url, "/events/webhooks")).json()) as unknown[]).toEqual([]);
}, 90_000);

test("the registry: kept across instances, a patch merges into the registration, deletes leave at most maxTombstones tombstones; a file that is not a registry stops the gateway naming it", () => {
  const home = mkdtempSync("/tmp/aenv-gw-reg-");
  try {
    const r = new WebhookRegistry(home);
    const id = "00000000-0000-4000-8000-00000000000a";
    expect(r.put(id, { name: "n", url: "http://x/", events: ["sandbox.lifecycle.created"], signatureSecret: "s" }).version).toBe(1);
    expect(r.patch(id, { enabled: false })).toEqual({ id, version: 2, body: { name: "n", url: "http://x/", events: ["sandbox.lifecycle.created"], signatureSecret: "s", enabled: false } });
    expect(r.patch("00000000-0000-4000-8000-00000000000b", { enabled: false })).toBeUndefined();
    expect(MAX_TOMBSTONES).toBe(1000);
    const again = new WebhookRegistry(home, 3);
    expect(again.list()).toEqual(r.list());
    for (let i = 0; i < 5; i++) again.remove(`00000000-0000-4000-8000-${String(i).padStart(12, "0")}`);
    expect(again.deleted().map((t) => t.id.slice(-1))).toEqual(["2", "3", "4"]);
    // a registration again after its delete is no longer a tombstone
    again.remove(id);
    expect([again.has(id), again.deleted().at(-1)!.id]).toEqual([false, id]);
    again.put(id, { name: "back" });
    expect([again.has(id), again.deleted().some((t) => t.id === id)]).toEqual([true, false]);

    writeFileSync(join(home, "gateway-webhooks.json"), '{"format": 1, "generation": "x"}');
    let err: unknown;
    try {
      new WebhookRegistry(home);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe("gateway.bad_state");
    expect((err as GatewayError).message).toBe(`${join(home, "gateway-webhooks.json")} is not a webhook registry (/webhooks: Expected required property); move it away to start without the webhooks it held`);
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});
