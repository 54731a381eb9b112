/**
 * Signed webhooks end to end (issue 29 item 4): a real node (SQLite, orchestrator, API, delivery
 * lanes) whose sandboxes are loopback guests, driven by the unmodified e2b@2.51.0 SDK, and HTTP
 * receivers in this test that verify every delivery's signature with E2B's published formula
 * (SHA-256 of secret + raw body, base64url without padding; written out here, not imported).
 * Retry bounds are small ([events] webhook_retry_*), so an outage of a receiver (its listener
 * really closed: connections refused) spans several failed attempts without a long wait.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import type { Server } from "bun";
import { Sandbox } from "e2b";
import type { EventType, SandboxLifecycleEvent } from "../../src/events/index.ts";
import { api, startNodeNoVm, type TestNode } from "../api/helpers.ts";
import { waitFor as wait } from "../helpers/wait.ts";

const ENV = {
  AENV__events__webhook_retry_initial_ms: "100",
  AENV__events__webhook_retry_max_ms: "800",
  AENV__events__webhook_timeout_ms: "3000",
};
const GUEST = { templates: ["base"] };
const LIFECYCLE: EventType[] = ["sandbox.lifecycle.created", "sandbox.lifecycle.paused", "sandbox.lifecycle.resumed", "sandbox.lifecycle.killed"];

/** E2B's signature, as its docs' verification code computes it. */
function e2bSignature(secret: string, raw: string): string {
  return createHash("sha256").update(secret + raw, "utf8").digest("base64").replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

interface Delivery {
  headers: Record<string, string>;
  raw: string;
  event: SandboxLifecycleEvent;
}

/** An HTTP receiver on a fixed loopback port that can go down and come back. */
class Receiver {
  port = 0;
  readonly got: Delivery[] = [];
  private server: Server<undefined> | undefined;

  constructor(private readonly status = 200) {}

  get url(): string {
    return `http://127.0.0.1:${this.port}/hook`;
  }

  up(): this {
    this.server = Bun.serve({
      hostname: "127.0.0.1",
      port: this.port,
      fetch: async (req) => {
        const raw = await req.text();
        this.got.push({ headers: Object.fromEntries(req.headers), raw, event: JSON.parse(raw) as SandboxLifecycleEvent });
        return new Response("thanks", { status: this.status });
      },
    });
    this.port = this.server.port!;
    return this;
  }

  down(): void {
    this.server?.stop(true);
    this.server = undefined;
  }

  /** Deliveries of sandbox `id`. */
  of(id: string): Delivery[] {
    return this.got.filter((d) => d.event.sandboxId === id);
  }
}

let node: TestNode;
let opts: { apiUrl: string; apiKey: string; sandboxUrl: string };
const receivers: Receiver[] = [];

beforeAll(async () => {
  node = await startNodeNoVm(ENV, undefined, GUEST);
  opts = { apiUrl: node.url, apiKey: node.apiKey, sandboxUrl: node.url };
});

afterAll(async () => {
  for (const r of receivers) r.down();
  await node.dispose();
});

function receiver(status = 200): Receiver {
  const r = new Receiver(status).up();
  receivers.push(r);
  return r;
}

async function register(url: string, secret: string, events: string[] = LIFECYCLE): Promise<string> {
  const r = await api(node, "/events/webhooks", { method: "POST", body: JSON.stringify({ name: "test", url, events, signatureSecret: secret }) });
  expect(r.status).toBe(201);
  return ((await r.json()) as { id: string }).id;
}

/** `cond` true within `ms` (the shared wait, with this file's default bound). */
const waitFor = (what: string, cond: () => boolean | Promise<boolean>, ms = 20_000) => wait(what, cond, { timeoutMs: ms });

/** created -> paused -> resumed -> killed of one sandbox through the SDK; its id. */
async function lifecycle(): Promise<string> {
  const sbx = await Sandbox.create("base", { ...opts, metadata: { by: "webhooks" } });
  await sbx.pause();
  await Sandbox.connect(sbx.sandboxId, opts);
  await sbx.kill();
  return sbx.sandboxId;
}

/** The events of `ds` without repeats, checking that every repeat is the same event (same id, same bytes). */
function distinct(ds: Delivery[]): SandboxLifecycleEvent[] {
  const byId = new Map<string, string>();
  const out: SandboxLifecycleEvent[] = [];
  for (const d of ds) {
    const seen = byId.get(d.event.id);
    if (seen !== undefined) {
      expect(d.raw).toBe(seen);
      continue;
    }
    byId.set(d.event.id, d.raw);
    out.push(d.event);
  }
  return out;
}

test("a receiver verifies the signature of created -> paused -> resumed -> killed, delivered in order; a wrong secret fails verification", async () => {
  const rx = receiver();
  const secret = "s3cret-for-e2e";
  const hook = await register(rx.url, secret);
  const id = await lifecycle();
  await waitFor("4 deliveries", () => rx.of(id).length >= 4);
  const ds = rx.of(id);
  expect(ds.map((d) => d.event.type)).toEqual(LIFECYCLE);
  for (const d of ds) {
    expect(d.headers["content-type"]).toBe("application/json");
    expect(d.headers["e2b-webhook-id"]).toBe(hook);
    expect(d.headers["e2b-signature-version"]).toBe("v1");
    expect(d.headers["e2b-delivery-id"]).toMatch(/^[0-9a-f-]{36}$/);
    expect(d.headers["e2b-signature"]).toBe(e2bSignature(secret, d.raw));
    expect(d.headers["e2b-signature"]).not.toBe(e2bSignature("wrong-secret", d.raw));
    expect(d.headers["e2b-signature"]).not.toBe(e2bSignature(secret, d.raw + " "));
  }
  expect(new Set(ds.map((d) => d.headers["e2b-delivery-id"])).size).toBe(4);
  // the body is the event as the API serves it
  const served = (await (await api(node, `/events/sandboxes/${id}?orderAsc=true`)).json()) as SandboxLifecycleEvent[];
  expect(ds.map((d) => d.event)).toEqual(served);
  expect(ds[0]!.event.eventData).toMatchObject({ sandbox_metadata: { by: "webhooks" } });
  // the delivery log: one successful attempt per event, newest event first
  const log = (await (await api(node, `/events/webhooks/${hook}/deliveries`)).json()) as { data: { eventId: string; attempts: { status: string; responseHttpStatusCode: number; responseBody: string }[] }[]; nextCursor: string | null };
  expect(log.data.map((d) => d.eventId)).toEqual([...served].reverse().map((e) => e.id));
  for (const d of log.data) expect(d.attempts).toMatchObject([{ status: "success", responseHttpStatusCode: 200, responseBody: "thanks" }]);
  // pages of 3 in delivery order, then the rest
  const p1 = (await (await api(node, `/events/webhooks/${hook}/deliveries?orderAsc=true&limit=3`)).json()) as { data: { eventId: string }[]; nextCursor: string | null };
  const p2 = (await (await api(node, `/events/webhooks/${hook}/deliveries?orderAsc=true&limit=3&cursor=${p1.nextCursor}`)).json()) as { data: { eventId: string }[]; nextCursor: string | null };
  expect([...p1.data, ...p2.data].map((d) => d.eventId)).toEqual(served.map((e) => e.id));
  expect(p2.nextCursor).toBeNull();
  expect((await api(node, `/events/webhooks/${hook}/deliveries?cursor=x_y`)).status).toBe(400);
  await api(node, `/events/webhooks/${hook}`, { method: "DELETE" });
});

test("a receiver down for a while, then back, gets every event once, in order (repeats only with the same id); the queue survives a node restart", async () => {
  const rx = receiver();
  const secret = "outage";
  const hook = await register(rx.url, secret);
  rx.down();
  const id = await lifecycle();
  // the outage is real: the head event fails again and again, with growing waits between tries
  const attempts = async () => ((await (await api(node, `/events/webhooks/${hook}/deliveries?deliveryStatus=failed&orderAsc=true`)).json()) as { data: { attempts: { at?: string; timestamp: string; errorClass: string }[] }[] }).data;
  await waitFor("5 failed attempts", async () => ((await attempts())[0]?.attempts.length ?? 0) >= 5);
  const failed = (await attempts())[0]!.attempts;
  expect(failed.every((a) => a.errorClass === "transport_error")).toBe(true);
  const gaps = failed.slice(1).map((a, i) => Date.parse(a.timestamp) - Date.parse(failed[i]!.timestamp));
  expect(gaps[gaps.length - 1]!).toBeGreaterThan(gaps[0]!);
  expect(rx.got).toEqual([]);

  // the node restarts with the events still queued (on disk), then the receiver comes back
  const home = node.home;
  await node.close();
  node = await startNodeNoVm(ENV, home, GUEST);
  opts = { apiUrl: node.url, apiKey: node.apiKey, sandboxUrl: node.url };
  rx.up();
  await waitFor("4 events", () => distinct(rx.of(id)).length >= 4);
  const got = distinct(rx.of(id));
  expect(got.map((e) => e.type)).toEqual(LIFECYCLE);
  for (const d of rx.of(id)) expect(d.headers["e2b-signature"]).toBe(e2bSignature(secret, d.raw));
  // nothing more is owed: the queue is empty
  await waitFor("an empty queue", () => node.events.dispatcher.depth(hook) === 0);
  const log = (await (await api(node, `/events/webhooks/${hook}/deliveries?orderAsc=true`)).json()) as { data: { eventId: string; attempts: { status: string }[] }[] };
  expect(log.data.map((d) => d.eventId)).toEqual(got.map((e) => e.id));
  expect(log.data[0]!.attempts.map((a) => a.status).slice(-1)).toEqual(["success"]);
  expect(log.data[0]!.attempts.filter((a) => a.status === "failed").length).toBeGreaterThanOrEqual(5);
  await api(node, `/events/webhooks/${hook}`, { method: "DELETE" });
});

test("a dead receiver holds up nobody else: another webhook gets everything at once; its own queue keeps the newest [events] webhook_queue_max", async () => {
  const small = await startNodeNoVm({ ...ENV, AENV__events__webhook_queue_max: "3" }, undefined, GUEST);
  try {
    const live = receiver();
    const dead = receiver();
    dead.down();
    const reg = async (url: string) => ((await (await api(small, "/events/webhooks", { method: "POST", body: JSON.stringify({ name: "x", url, events: ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"], signatureSecret: "k" }) })).json()) as { id: string }).id;
    const deadHook = await reg(dead.url);
    await reg(live.url);
    const o = { apiUrl: small.url, apiKey: small.apiKey, sandboxUrl: small.url };
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const s = await Sandbox.create("base", o);
      ids.push(s.sandboxId);
      await s.kill();
    }
    await waitFor("8 events at the live receiver", () => distinct(live.got).length >= 8);
    expect(distinct(live.got).map((e) => `${e.sandboxId}:${e.type}`)).toEqual(ids.flatMap((id) => [`${id}:sandbox.lifecycle.created`, `${id}:sandbox.lifecycle.killed`]));
    // the dead one's queue: the newest 3 events; the 5 before them were dropped
    expect(small.events.dispatcher.depth(deadHook)).toBe(3);
    expect(small.events.dispatcher.dropped.get(deadHook)).toBe(5);
    dead.up();
    await waitFor("3 events at the revived receiver", () => distinct(dead.got).length >= 3);
    expect(distinct(dead.got).map((e) => `${e.sandboxId}:${e.type}`)).toEqual([`${ids[2]}:sandbox.lifecycle.killed`, `${ids[3]}:sandbox.lifecycle.created`, `${ids[3]}:sandbox.lifecycle.killed`]);
  } finally {
    await small.dispose();
  }
});

test("/events/webhooks CRUD as E2B defines it: 201 without the secret, list, get, patch, delete 200, 404 after; bad fields are 400 naming them; a replaced secret signs the next deliveries", async () => {
  const rx = receiver();
  const created = await api(node, "/events/webhooks", { method: "POST", body: JSON.stringify({ name: "crud", url: rx.url, events: ["sandbox.lifecycle.created"], signatureSecret: "one" }) });
  expect(created.status).toBe(201);
  const w = (await created.json()) as Record<string, unknown>;
  expect(w).toEqual({ id: expect.stringMatching(/^[0-9a-f-]{36}$/), teamId: "00000000-0000-0000-0000-000000000000", name: "crud", createdAt: expect.stringMatching(/Z$/), url: rx.url, enabled: true, events: ["sandbox.lifecycle.created"] });
  const id = w.id as string;
  expect(((await (await api(node, "/events/webhooks")).json()) as { id: string }[]).some((x) => x.id === id)).toBe(true);
  expect(await (await api(node, `/events/webhooks/${id}`)).json()).toEqual(w);
  const patched = (await (await api(node, `/events/webhooks/${id}`, { method: "PATCH", body: JSON.stringify({ name: "renamed", signatureSecret: "two" }) })).json()) as Record<string, unknown>;
  expect(patched).toEqual({ ...w, name: "renamed" });
  const s = await Sandbox.create("base", opts);
  await waitFor("the created event", () => rx.of(s.sandboxId).length >= 1);
  expect(rx.of(s.sandboxId)[0]!.headers["e2b-signature"]).toBe(e2bSignature("two", rx.of(s.sandboxId)[0]!.raw));
  // disabled: nothing more is delivered
  await api(node, `/events/webhooks/${id}`, { method: "PATCH", body: JSON.stringify({ enabled: false, events: ["sandbox.lifecycle.killed"] }) });
  await s.kill();
  await waitFor("the killed event recorded", async () => ((await (await api(node, `/events/sandboxes/${s.sandboxId}`)).json()) as unknown[]).length === 2);
  expect(rx.of(s.sandboxId).length).toBe(1);
  // PUT under a given id: 201 creates, 200 replaces
  const given = "3f2b8c1e-0000-4000-8000-00000000abcd";
  const put = (body: unknown) => api(node, `/events/webhooks/${given}`, { method: "PUT", body: JSON.stringify(body) });
  expect((await put({ name: "p", url: rx.url, events: ["sandbox.lifecycle.paused"], signatureSecret: "x" })).status).toBe(201);
  expect((await put({ name: "p2", url: rx.url, events: ["sandbox.lifecycle.paused"], signatureSecret: "x" })).status).toBe(200);
  expect(((await (await api(node, `/events/webhooks/${given}`)).json()) as { name: string }).name).toBe("p2");
  for (const [body, field] of [
    [{ name: "b", url: "ftp://x", events: ["sandbox.lifecycle.created"], signatureSecret: "x" }, "url"],
    [{ name: "b", url: "not a url", events: ["sandbox.lifecycle.created"], signatureSecret: "x" }, "url"],
    [{ name: "b", url: rx.url, events: ["sandbox.lifecycle.nope"], signatureSecret: "x" }, "events"],
    [{ name: "b", url: rx.url, events: [], signatureSecret: "x" }, "events"],
    [{ name: "", url: rx.url, events: ["sandbox.lifecycle.created"], signatureSecret: "x" }, "name"],
    [{ name: "b", url: rx.url, events: ["sandbox.lifecycle.created"], signatureSecret: "" }, "signatureSecret"],
  ] as const) {
    const r = await api(node, "/events/webhooks", { method: "POST", body: JSON.stringify(body) });
    expect({ field, status: r.status, body: await r.json() }).toMatchObject({ field, status: 400, body: { code: 400, error_code: "events.bad_request" } });
  }
  expect((await api(node, "/events/webhooks", { method: "POST", body: JSON.stringify({ name: "b" }) })).status).toBe(400);
  for (const x of [id, given]) {
    const d = await api(node, `/events/webhooks/${x}`, { method: "DELETE" });
    expect([d.status, await d.text()]).toEqual([200, ""]);
    const gone = await api(node, `/events/webhooks/${x}`);
    expect([gone.status, ((await gone.json()) as { code: number }).code]).toEqual([404, 404]);
  }
  expect((await api(node, `/events/webhooks/${id}`, { method: "PATCH", body: "{}" })).status).toBe(404);
  expect((await api(node, `/events/webhooks/${id}/deliveries`)).status).toBe(404);
});

test("[events] max_webhooks bounds the registrations: 429 beyond it", async () => {
  const n = await startNodeNoVm({ AENV__events__max_webhooks: "2" });
  try {
    const body = JSON.stringify({ name: "m", url: "http://127.0.0.1:9/", events: ["sandbox.lifecycle.created"], signatureSecret: "x" });
    expect((await api(n, "/events/webhooks", { method: "POST", body })).status).toBe(201);
    expect((await api(n, "/events/webhooks", { method: "POST", body })).status).toBe(201);
    const third = await api(n, "/events/webhooks", { method: "POST", body });
    expect([third.status, ((await third.json()) as { error_code: string }).error_code]).toEqual([429, "events.webhook_limit"]);
  } finally {
    await n.dispose();
  }
});
