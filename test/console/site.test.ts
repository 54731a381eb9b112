/**
 * The console over HTTP and the terminal protocol's refusals, against a real node whose
 * sandboxes are loopback guests (no VM; their envd port answers only /health, so a terminal
 * that gets past its ticket fails at envd's process start): the page and its bundle (no key,
 * CSP, gzip, content-hashed names cached for good, no third-party URL), the ticket route
 * (key, unknown and paused sandboxes), and the WebSocket's close codes for a missing, wrong,
 * reused or foreign ticket, a silent client, bad frames and a failing envd.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CLOSE } from "../../src/console/index.ts";
import { api, createLoopback, startNodeNoVm, type TestNode } from "../api/helpers.ts";

let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm({ AENV__console__auth_timeout_ms: "300", AENV__console__max_terminals: "2" }, undefined, {});
}, 60_000);
afterAll(async () => {
  await node?.dispose();
}, 60_000);

test("the page and its bundle: public, same-origin only, gzip, hashed names cached for good", async () => {
  const redirect = await fetch(`${node.url}/console`, { redirect: "manual" });
  expect(redirect.status).toBe(301);
  expect(redirect.headers.get("location")).toBe("/console/");
  const page = await fetch(`${node.url}/console/`);
  expect(page.status).toBe(200);
  expect(page.headers.get("content-type")).toBe("text/html; charset=utf-8");
  expect(page.headers.get("cache-control")).toBe("no-store");
  expect(page.headers.get("content-security-policy")).toContain("default-src 'self'");
  expect(page.headers.get("content-security-policy")).toContain("frame-ancestors 'none'");
  const html = await page.text();
  expect(html).toContain('data-role="node"');
  const assets = [...html.matchAll(/\/console\/assets\/[^"]+/g)].map((m) => m[0]);
  expect(assets.length).toBe(2);
  expect(html).not.toMatch(/https?:\/\//);
  let js = "";
  for (const a of assets) {
    expect(a).toMatch(/\/(main|app)-[a-z0-9]+\.(js|css)$/);
    const plain = await fetch(node.url + a, { headers: { "accept-encoding": "identity" } });
    expect(plain.status).toBe(200);
    expect(plain.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
    const body = new Uint8Array(await plain.arrayBuffer());
    const gz = await fetch(node.url + a, { headers: { "accept-encoding": "gzip" }, decompress: false } as RequestInit);
    expect(gz.headers.get("content-encoding")).toBe("gzip");
    const packed = new Uint8Array(await gz.arrayBuffer());
    expect(packed.length).toBeLessThan(body.length);
    expect(Bun.gunzipSync(packed)).toEqual(body);
    if (a.endsWith(".js")) js = new TextDecoder().decode(body);
  }
  // the entry loads its chunks by relative name from the same folder; none is fetched from elsewhere
  const chunks = [...js.matchAll(/"\.\/(chunk-[a-z0-9]+\.js)"/g)].map((m) => m[1]);
  expect(chunks.length).toBeGreaterThan(0);
  for (const c of chunks) expect((await fetch(`${node.url}/console/assets/${c}`)).status).toBe(200);
  expect((await fetch(`${node.url}/console/assets/main-nosuch.js`)).status).toBe(404);
  expect((await fetch(`${node.url}/console/`, { method: "POST" })).status).toBe(405);
  // the API itself still wants the key
  expect((await fetch(`${node.url}/v2/sandboxes`)).status).toBe(401);
});

test("ticket route: the key, an unknown sandbox (404), a paused one (409); a ticket is one-use and short-lived", async () => {
  const s = await createLoopback(node);
  expect((await api(node, `/sandboxes/${s.id}/terminal`, { method: "POST", key: null })).status).toBe(401);
  const unknown = await api(node, "/sandboxes/nosuch/terminal", { method: "POST" });
  expect(unknown.status).toBe(404);
  expect(await unknown.json()).toMatchObject({ code: 404, error_code: "console.sandbox_not_found" });
  const ok = await api(node, `/sandboxes/${s.id}/terminal`, { method: "POST" });
  expect(ok.status).toBe(201);
  const t = (await ok.json()) as { ticket: string; expiresAt: number };
  expect(t.ticket).toMatch(/^[0-9a-f]{64}$/);
  expect(t.expiresAt).toBeGreaterThan(Date.now());
  await node.orch.pause(s.id);
  const paused = await api(node, `/sandboxes/${s.id}/terminal`, { method: "POST" });
  expect(paused.status).toBe(409);
  expect(await paused.json()).toMatchObject({ error_code: "console.sandbox_not_running", message: expect.stringContaining("paused") });
  await node.orch.kill(s.id);
});

/** Open the terminal socket of `id`, send `first` (if any), and return how it closed and what came. */
async function session(id: string, first: (string | Uint8Array)[]): Promise<{ code: number; reason: string; texts: string[] }> {
  const ws = new WebSocket(`${node.url.replace("http", "ws")}/sandboxes/${id}/terminal`);
  const texts: string[] = [];
  return new Promise((resolve, reject) => {
    ws.onopen = () => first.forEach((m) => ws.send(m));
    ws.onmessage = (e) => typeof e.data === "string" && texts.push(e.data);
    ws.onerror = () => reject(new Error("socket error"));
    ws.onclose = (e) => resolve({ code: e.code, reason: e.reason, texts });
  });
}

async function ticket(id: string): Promise<string> {
  const r = await api(node, `/sandboxes/${id}/terminal`, { method: "POST" });
  expect(r.status).toBe(201);
  return ((await r.json()) as { ticket: string }).ticket;
}

const auth = (t: string, extra: Record<string, unknown> = {}) => JSON.stringify({ type: "auth", ticket: t, cols: 80, rows: 24, ...extra });

test("terminal socket refusals: close codes for every bad start", async () => {
  const a = await createLoopback(node);
  const b = await createLoopback(node);
  // no frame at all: closed after auth_timeout_ms
  expect(await session(a.id, [])).toMatchObject({ code: CLOSE.authTimeout });
  // input before the auth frame
  expect(await session(a.id, [new Uint8Array([0x6c, 0x73])])).toMatchObject({ code: CLOSE.protocol });
  // made-up ticket; the API key is not a ticket
  expect(await session(a.id, [auth("0".repeat(64))])).toMatchObject({ code: CLOSE.badTicket });
  expect(await session(a.id, [auth(node.apiKey)])).toMatchObject({ code: CLOSE.badTicket });
  // a ticket for b shown at a's socket is refused, and spent
  const tb = await ticket(b.id);
  expect(await session(a.id, [auth(tb)])).toMatchObject({ code: CLOSE.badTicket });
  expect(await session(b.id, [auth(tb)])).toMatchObject({ code: CLOSE.badTicket });
  // bad sizes and a non-JSON auth frame
  expect(await session(a.id, [auth(await ticket(a.id), { cols: 0 })])).toMatchObject({ code: CLOSE.protocol });
  expect(await session(a.id, ["{nope"])).toMatchObject({ code: CLOSE.protocol });
  // a good ticket: the loopback guest has no process service, so envd's start fails (4502), and the ticket is spent
  const ta = await ticket(a.id);
  const failed = await session(a.id, [auth(ta)]);
  expect(failed.code).toBe(CLOSE.envdFailed);
  expect(failed.reason).toContain("envd process start answered 404");
  expect(await session(a.id, [auth(ta)])).toMatchObject({ code: CLOSE.badTicket });
  // a sandbox paused after its ticket was minted
  const tp = await ticket(a.id);
  await node.orch.pause(a.id);
  expect(await session(a.id, [auth(tp)])).toMatchObject({ code: CLOSE.sandboxGone, reason: "sandbox is paused" });
  // a plain GET of the terminal path is not an API route
  expect((await api(node, `/sandboxes/${a.id}/terminal`)).status).toBe(404);
  await node.orch.kill(a.id);
  await node.orch.kill(b.id);
}, 30_000);
