/**
 * Sandbox proxy against real guests: every sandbox is created through the orchestrator and runs
 * as a loopback guest (HTTP + WebSocket servers on its own 127.x.y.z address, ports 49983 and
 * 3000; 8080 stays closed), so the proxy finds it through its route table exactly as it finds a
 * VM in its slot.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox } from "e2b";
import { SandboxProxy } from "../../src/api/proxy.ts";
import { fileSignature } from "../../src/envd/signature.ts";
import type { GuestFetch } from "../helpers/loopback-runtime.ts";
import { initEnvd, startEnvdChild, type EnvdChild } from "../envd/harness.ts";
import { createLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";
import { waitEvent, waitFor } from "../helpers/wait.ts";

let node: TestNode;
let ID = "";

const guest: GuestFetch = async (req, { server, sandboxId }) => {
  const u = new URL(req.url);
  if (u.pathname === "/ws") return server.upgrade(req, { data: { sandboxId } }) ? undefined : new Response("no", { status: 400 });
  if (u.pathname === "/stream") {
    const body = new ReadableStream({
      async start(c) {
        for (let i = 0; i < 4; i++) {
          c.enqueue(new TextEncoder().encode(`chunk${i}\n`));
          await Bun.sleep(150);
        }
        c.close();
      },
    });
    return new Response(body, { headers: { "content-type": "text/plain" } });
  }
  if (u.pathname === "/slow") {
    // answers after ?ms= milliseconds (the body, if any, read first)
    if (req.body) await req.arrayBuffer();
    await Bun.sleep(Number(u.searchParams.get("ms")));
    return new Response("slow answer");
  }
  if (u.pathname === "/broken") {
    // 3 chunks, then the connection breaks (the guest's server resets it)
    let n = 0;
    const body = new ReadableStream({
      async pull(c) {
        if (++n > 3) return c.error(undefined);
        c.enqueue(new Uint8Array(64 * 1024).fill(n));
        await Bun.sleep(20);
      },
    }, { highWaterMark: 0 });
    return new Response(body, { headers: { "content-length": String(10 * 64 * 1024) } });
  }
  if (u.pathname === "/forever") {
    let timer: ReturnType<typeof setInterval>;
    const body = new ReadableStream({
      start(c) {
        timer = setInterval(() => c.enqueue(new TextEncoder().encode("tick\n")), 50);
      },
      cancel() {
        clearInterval(timer);
      },
    });
    return new Response(body);
  }
  if (u.pathname === "/sha") {
    const h = createHash("sha256");
    let n = 0;
    for await (const chunk of req.body!) {
      h.update(chunk);
      n += chunk.byteLength;
    }
    return Response.json({ n, sha: h.digest("hex") });
  }
  if (u.pathname === "/slowsha") {
    // a slow reader: 30 ms pause after every 4 MiB, so a proxy that read ahead would hold the rest
    const h = createHash("sha256");
    let n = 0;
    let nextPause = 4 << 20;
    for await (const chunk of req.body!) {
      h.update(chunk);
      n += chunk.byteLength;
      if (n >= nextPause) {
        nextPause += 4 << 20;
        await Bun.sleep(30);
      }
    }
    return Response.json({ n, sha: h.digest("hex") });
  }
  if (u.pathname === "/files") {
    // envd's own check of the signature (src/envd/http/files.ts), with this sandbox's token
    const q = u.searchParams;
    const exp = q.get("signature_expiration");
    const want = fileSignature(q.get("path") ?? "", req.method === "GET" ? "read" : "write", q.get("username") ?? "", node.orch.get(sandboxId).envdAccessToken!, exp === null ? undefined : Number(exp));
    return Response.json({ sandbox: sandboxId, method: req.method, path: q.get("path"), signatureValid: q.get("signature") === want });
  }
  if (u.pathname === "/boom") return Response.json({ code: 500, message: "envd exploded at step X" }, { status: 500 });
  if (u.pathname === "/gzip") return new Response(Bun.gzipSync(new TextEncoder().encode("hello gzip")), { headers: { "content-encoding": "gzip" } });
  const headers: Record<string, string> = {};
  req.headers.forEach((v, k) => (headers[k] = v));
  return Response.json({ sandbox: sandboxId, port: new URL(req.url).port, method: req.method, path: u.pathname + u.search, headers, body: await req.text() }, { status: u.pathname === "/teapot" ? 418 : 200, headers: { "x-up": "1" } });
};

beforeAll(async () => {
  node = await startNodeNoVm({ AENV_SANDBOX_PROXY_DOMAINS: "agentenv.test" }, undefined, {
    ports: [49983, 3000],
    fetch: guest,
    wsMessage(ws, m) {
      if (m === "close-me") return ws.close(4001, "bye");
      ws.send(typeof m === "string" ? `echo:${m}` : new Uint8Array([...new Uint8Array(m)].reverse()));
    },
  });
  ID = (await createLoopback(node)).id;
});

afterAll(async () => {
  await node.dispose();
});

const hdr = (port = 49983, id = ID) => ({ "E2b-Sandbox-Id": id, "E2b-Sandbox-Port": String(port) });

test("E2B headers route to the sandbox port, any method, body and query pass, routing headers are stripped", async () => {
  const r = await fetch(`${node.url}/some/path?x=1&y=2`, { method: "PUT", headers: { ...hdr(), "x-access-token": "tok", "content-type": "text/plain" }, body: "payload" });
  expect(r.status).toBe(200);
  expect(r.headers.get("x-up")).toBe("1");
  const b = (await r.json()) as any;
  expect(b).toMatchObject({ method: "PUT", path: "/some/path?x=1&y=2", body: "payload" });
  expect(b.headers["x-access-token"]).toBe("tok");
  expect(b.headers["e2b-sandbox-id"]).toBeUndefined();
  expect(b.headers["x-forwarded-for"]).toBe("127.0.0.1");
  // envd's /health collides with the API's /health: the routing header wins
  const h = await fetch(`${node.url}/health`, { headers: hdr() });
  expect(((await h.json()) as any).path).toBe("/health");
  // upstream status codes pass through unchanged
  expect((await fetch(`${node.url}/teapot`, { headers: hdr(3000) })).status).toBe(418);
});

test("x-agentenv-sandbox-id, {port}-{id}.{domain} hosts and /proxy/{id}/{port}/... route too", async () => {
  const a = (await (await fetch(`${node.url}/a?q=1`, { headers: { "x-agentenv-sandbox-id": ID } })).json()) as any;
  expect(a.path).toBe("/a?q=1");
  const b = (await (await fetch(`${node.url}/b`, { headers: { host: `3000-${ID}.agentenv.test` } })).json()) as any;
  expect(b.path).toBe("/b");
  const c = (await (await fetch(`${node.url}/proxy/${ID}/3000/c/d?z=9`, { method: "POST", body: "x" })).json()) as any;
  expect(c).toMatchObject({ path: "/c/d?z=9", method: "POST", body: "x" });
  // a host under an unconfigured domain is an API request (and needs the key)
  expect((await fetch(`${node.url}/b`, { headers: { host: `3000-${ID}.other.test` } })).status).toBe(401);
});

test("x-agentenv-target-port (upstream AgentENV's header) names the port too; port headers that disagree are a 400", async () => {
  const at = async (headers: Record<string, string>) => {
    const r = await fetch(`${node.url}/where`, { headers: { "x-agentenv-sandbox-id": ID, ...headers } });
    return { status: r.status, body: (await r.json()) as { port?: string; code?: number; error_code?: string; message?: string; headers?: Record<string, string> } };
  };
  const t = await at({ "x-agentenv-target-port": "3000" });
  expect([t.status, t.body.port]).toEqual([200, "3000"]);
  expect(t.body.headers!["x-agentenv-target-port"]).toBeUndefined(); // routing headers are not passed on
  expect((await at({})).body.port).toBe("49983");
  // the same port named twice is fine
  expect((await at({ "x-agentenv-target-port": "3000", "e2b-sandbox-port": "3000" })).body.port).toBe("3000");
  const clash = await at({ "x-agentenv-target-port": "3000", "x-agentenv-sandbox-port": "49983" });
  expect(clash).toEqual({ status: 400, body: { code: 400, error_code: "api.validation", message: "conflicting sandbox ports (x-agentenv-sandbox-port: 49983, x-agentenv-target-port: 3000): name one port" } });
  const bad = await at({ "x-agentenv-target-port": "99999" });
  expect(bad).toEqual({ status: 400, body: { code: 400, error_code: "api.validation", message: 'invalid sandbox port "99999" in header x-agentenv-target-port' } });
  // a bad port in a /proxy path is the same typed 400
  const path = await fetch(`${node.url}/proxy/${ID}/99999/x`);
  expect([path.status, await path.json(), path.headers.get("x-agentenv-error-source")]).toEqual([400, { code: 400, error_code: "api.validation", message: "invalid sandbox port 99999" }, "proxy"]);
});

test("responses stream without buffering; request bodies stream up; gzip passes untouched", async () => {
  const t0 = performance.now();
  const res = await fetch(`${node.url}/stream`, { headers: hdr() });
  const reader = res.body!.getReader();
  const times: number[] = [];
  let text = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    times.push(performance.now() - t0);
    text += new TextDecoder().decode(value);
  }
  expect(text).toBe("chunk0\nchunk1\nchunk2\nchunk3\n");
  // chunks arrive spread out as produced (~450 ms from first to last), not all at once at the end
  expect(times[times.length - 1]! - times[0]!).toBeGreaterThan(300);

  const size = 24 * 1024 * 1024;
  const data = new Uint8Array(size);
  for (let i = 0; i < size; i += 4096) data[i] = i & 0xff;
  const up = (await (await fetch(`${node.url}/sha`, { method: "POST", headers: hdr(), body: data })).json()) as any;
  expect(up).toEqual({ n: size, sha: createHash("sha256").update(data).digest("hex") });

  const gz = await fetch(`${node.url}/gzip`, { headers: hdr(), decompress: false } as RequestInit);
  expect(gz.headers.get("content-encoding")).toBe("gzip");
  expect(new TextDecoder().decode(Bun.gunzipSync(new Uint8Array(await gz.arrayBuffer())))).toBe("hello gzip");
});

test("a body that breaks off upstream fails the client's read after the bytes sent so far: never a clean end (fetch throws, curl exits 56)", async () => {
  const res = await fetch(`${node.url}/broken`, { headers: hdr() });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  let got = 0;
  const end = await (async () => {
    try {
      for (;;) {
        const r = await reader.read();
        if (r.done) return "done";
        got += r.value.byteLength;
      }
    } catch (e) {
      return String(e);
    }
  })();
  expect(end).toContain("closed unexpectedly");
  expect(got).toBeLessThanOrEqual(3 * 64 * 1024);
  const curl = Bun.spawn(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", "-H", `E2b-Sandbox-Id: ${ID}`, "-H", "E2b-Sandbox-Port: 49983", `${node.url}/broken`], { stdout: "pipe", stderr: "pipe" });
  expect(await curl.exited).toBe(56);
  expect(Number(await new Response(curl.stdout).text())).toBeLessThanOrEqual(3 * 64 * 1024);
});

test("WebSocket: text and binary frames both ways, close code passes through", async () => {
  const ws = new WebSocket(`${node.url.replace("http", "ws")}/ws`, { headers: hdr(3000) } as unknown as string[]);
  ws.binaryType = "arraybuffer";
  const got: (string | number[])[] = [];
  const closed = new Promise<{ code: number; reason: string }>((resolve) => (ws.onclose = (e) => resolve({ code: e.code, reason: e.reason })));
  ws.onmessage = (e) => got.push(typeof e.data === "string" ? e.data : [...new Uint8Array(e.data as ArrayBuffer)]);
  await new Promise((r) => (ws.onopen = r));
  ws.send("hi");
  ws.send(new Uint8Array([1, 2, 3]));
  await waitFor("both echoes", () => got.length >= 2);
  ws.send("close-me");
  expect(await closed).toEqual({ code: 4001, reason: "bye" });
  expect(got).toEqual(["echo:hi", [3, 2, 1]]);
});

test("502 JSON for an unknown sandbox, a closed port, a killed sandbox; 403 for envd's host-only routes; 400 for a bad port", async () => {
  const unknown = await fetch(`${node.url}/x`, { headers: hdr(49983, "nosuchsbx") });
  expect(unknown.status).toBe(502);
  expect(await unknown.json()).toEqual({ sandboxId: "nosuchsbx", message: "The sandbox was not found", code: 502 });
  const closed = await fetch(`${node.url}/x`, { headers: hdr(8080) });
  expect(closed.status).toBe(502);
  const closedBody = (await closed.json()) as { message: string };
  expect(closedBody).toMatchObject({ sandboxId: ID, code: 502, message: "The sandbox is running but port 8080 is not open: connection refused" });
  expect(closedBody.message).not.toContain("Is the computer");
  const ws = new WebSocket(`${node.url.replace("http", "ws")}/ws`, { headers: hdr(49983, "nosuchsbx") } as unknown as string[]);
  const wsErr = await new Promise<string>((r) => {
    ws.onerror = () => r("error");
    ws.onopen = () => r("open");
  });
  expect(wsErr).toBe("error");
  for (const p of ["/init", "/freeze", "/upgrade"]) {
    const r = await fetch(`${node.url}${p}`, { method: "POST", headers: hdr(), body: "{}" });
    expect(r.status).toBe(403);
    expect(((await r.json()) as any).code).toBe(403);
  }
  // /init on another port is just a path
  expect((await fetch(`${node.url}/init`, { method: "POST", headers: hdr(3000) })).status).toBe(200);
  for (const port of ["0", "70000", "abc"]) {
    const r = await fetch(`${node.url}/x`, { headers: { "E2b-Sandbox-Id": ID, "E2b-Sandbox-Port": port } });
    expect(r.status).toBe(400);
  }
  const two = (await createLoopback(node)).id;
  expect((await fetch(`${node.url}/x`, { headers: hdr(49983, two) })).status).toBe(200);
  await node.orch.kill(two);
  const gone = await fetch(`${node.url}/x`, { headers: hdr(49983, two) });
  expect(gone.status).toBe(502);
  expect(await gone.json()).toEqual({ sandboxId: two, message: "The sandbox was not found", code: 502 });
});

test("killing a sandbox cuts its proxied streams and WebSockets at once", async () => {
  const three = (await createLoopback(node)).id;
  const h = { "E2b-Sandbox-Id": three, "E2b-Sandbox-Port": "49983" };
  const res = await fetch(`${node.url}/forever`, { headers: h });
  const reader = res.body!.getReader();
  expect(new TextDecoder().decode((await reader.read()).value)).toContain("tick");
  const ws = new WebSocket(`${node.url.replace("http", "ws")}/ws`, { headers: h } as unknown as string[]);
  await new Promise((r) => (ws.onopen = r));
  const wsClosed = new Promise<number>((r) => (ws.onclose = (e) => r(e.code)));
  await node.orch.kill(three);
  const ended = (async () => {
    try {
      for (;;) if ((await reader.read()).done) return "done";
    } catch {
      return "error";
    }
  })();
  // a cut stream fails: the client cannot take it for one that ended
  expect(await ended).toBe("error");
  // 1001 is the proxy's "sandbox went away": cut by the kill (the /forever stream never ends by itself)
  expect(await wsClosed).toBe(1001);
});

test("a 500 from the sandbox passes through unchanged; the proxy's own errors carry x-agentenv-error-source: proxy", async () => {
  const up = await fetch(`${node.url}/boom`, { method: "POST", headers: hdr(), body: "{}" });
  expect(up.status).toBe(500);
  expect(up.headers.get("x-agentenv-error-source")).toBeNull();
  expect(await up.json()).toEqual({ code: 500, message: "envd exploded at step X" });
  const closed = await fetch(`${node.url}/x`, { headers: hdr(8080) });
  expect(closed.status).toBe(502);
  expect(closed.headers.get("x-agentenv-error-source")).toBe("proxy");
  await closed.arrayBuffer();
  // a failure inside the proxy itself: 500 JSON naming it, not an anonymous error page
  const proxy = new SandboxProxy(node.orch, { domains: [], connectTimeoutMs: 2000, idleTimeoutMs: 2000, settleTimeoutMs: 130_000, blockEnvdInternal: true });
  try {
    const broken = new Proxy(new Request("http://x/y"), {
      get(t, k) {
        if (k === "headers") throw new Error("headers unreadable");
        const v = Reflect.get(t, k, t);
        return typeof v === "function" ? v.bind(t) : v;
      },
    });
    const r = await proxy.forward(broken, { sandboxId: ID, port: 3000, pathAndQuery: "/y" }, null);
    expect(r.status).toBe(500);
    expect(r.headers.get("x-agentenv-error-source")).toBe("proxy");
    expect(await r.json()).toEqual({ sandboxId: ID, code: 500, message: "the node's proxy failed forwarding to port 3000: headers unreadable" });
  } finally {
    proxy.close();
  }
});

/**
 * A proxy of the test's own over the node's sandboxes whose route table reports each request that
 * starts waiting for a sandbox to settle (the real wait runs): `waiting()` resolves with the
 * sandbox's state at the next such wait.
 */
function observedProxy(): { proxy: SandboxProxy; waiting(): Promise<string> } {
  const proxy = new SandboxProxy(node.orch, { domains: [], connectTimeoutMs: 2000, idleTimeoutMs: 2000, settleTimeoutMs: 130_000, blockEnvdInternal: true });
  const settled = proxy.routes.settled.bind(proxy.routes);
  let onWait: ((state: string) => void) | undefined;
  proxy.routes.settled = (id, timeoutMs) => {
    const state = proxy.routes.get(id)?.state ?? "gone";
    const p = settled(id, timeoutMs); // registers its waiter before it returns
    onWait?.(state);
    return p;
  };
  return { proxy, waiting: () => new Promise((r) => (onWait = r)) };
}

test("a request racing a resume waits for the event that ends it; a paused sandbox is a 502 saying so", async () => {
  const id = (await createLoopback(node)).id;
  await node.orch.pause(id);
  // paused without autoResume: E2B's 502, naming the state and how to resume (not "not found")
  const paused = await fetch(`${node.url}/x`, { headers: hdr(49983, id) });
  expect(paused.status).toBe(502);
  expect(await paused.json()).toEqual({
    sandboxId: id,
    code: 502,
    message: `The sandbox ${id} is paused: resume it with Sandbox.connect() (POST /sandboxes/${id}/connect), or create it with autoResume so traffic resumes it`,
  });
  const { proxy, waiting } = observedProxy();
  const send = (path: string) => proxy.forward(new Request(`http://node${path}`, { headers: hdr(49983, id) }), { sandboxId: id, port: 49983, pathAndQuery: path }, null);
  try {
    // a resume held in the runtime: the sandbox is "resuming" while the request arrives
    const order: string[] = [];
    const gate = node.runtime!.gate("resume");
    const resumed = node.orch.connect(id);
    await gate.reached;
    expect(node.orch.get(id).state).toBe("resuming");
    const waited = waiting();
    const pending = send("/after-resume").then((r) => (order.push("response"), r));
    expect(await waited).toBe("resuming"); // the request is in the proxy, waiting
    order.push("resume released");
    gate.open();
    await resumed;
    const r = await pending;
    expect(order).toEqual(["resume released", "response"]);
    expect(r.status).toBe(200);
    expect(((await r.json()) as { path: string }).path).toBe("/after-resume");
    // a resume that fails leaves it paused (no autoResume): the waiting request gets the paused 502
    await node.orch.pause(id);
    const gate2 = node.runtime!.gate("resume");
    const failing = node.orch.connect(id).catch((e) => e);
    await gate2.reached;
    const waited2 = waiting();
    const pending2 = send("/x");
    expect(await waited2).toBe("resuming");
    gate2.open(new Error("restore broke"));
    expect(await failing).toMatchObject({ code: "orchestrator.runtime_failed" });
    const r2 = await pending2;
    expect(r2.status).toBe(502);
    expect(((await r2.json()) as { message: string }).message).toStartWith(`The sandbox ${id} is paused`);
  } finally {
    proxy.close();
  }
  await node.orch.kill(id);
});

test("a paused sandbox with autoResume is resumed by its traffic", async () => {
  const id = (await createLoopback(node, { autoResume: true })).id;
  await node.orch.pause(id);
  const starts = node.runtime!.starts;
  const r = await fetch(`${node.url}/woke`, { headers: hdr(49983, id) });
  expect(r.status).toBe(200);
  expect(((await r.json()) as { sandbox: string; path: string })).toMatchObject({ sandbox: id, path: "/woke" });
  expect(node.runtime!.starts).toBe(starts + 1);
  expect(node.orch.get(id).state).toBe("running");
  await node.orch.kill(id);
});

test("an upload may stream for longer than the connect timeout while it moves; a stalled one is cut by the idle timeout", async () => {
  // connect bound 200 ms, idle bound 1000 ms; the upload takes ~1.2 s in 12 chunks 100 ms apart
  const proxy = new SandboxProxy(node.orch, { domains: [], connectTimeoutMs: 200, idleTimeoutMs: 1000, settleTimeoutMs: 130_000, blockEnvdInternal: true });
  const chunk = new Uint8Array(64 * 1024).map((_, i) => i * 7);
  const upload = (gapMs: (i: number) => number, chunks: number) =>
    new Request("http://node/sha", {
      method: "POST",
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
    const ok = await proxy.forward(upload(() => 100, 12), { sandboxId: ID, port: 49983, pathAndQuery: "/sha" }, null);
    expect(ok.status).toBe(200);
    const whole = new Uint8Array(12 * chunk.length);
    for (let i = 0; i < 12; i++) whole.set(chunk, i * chunk.length);
    expect(await ok.json()).toEqual({ n: whole.length, sha: createHash("sha256").update(whole).digest("hex") });
    expect(performance.now() - t0).toBeGreaterThan(1000); // it did outlast the 200 ms connect bound
    // a body that stops moving for 2.5 s (> the 1 s idle bound) is cut
    const stalled = await proxy.forward(upload((left) => (left === 1 ? 2500 : 10), 4), { sandboxId: ID, port: 49983, pathAndQuery: "/sha" }, null);
    expect(stalled.status).toBe(502);
    expect(stalled.headers.get("x-agentenv-error-source")).toBe("proxy");
    expect(await stalled.json()).toEqual({ sandboxId: ID, code: 502, message: "The request to port 49983 of the sandbox was cut: the request body stalled for 1000 ms" });
  } finally {
    proxy.close();
  }
});

test("response_timeout_ms, not the connect or idle bound, bounds the wait for a slow answer: with and without a request body", async () => {
  const proxy = new SandboxProxy(node.orch, { domains: [], connectTimeoutMs: 200, idleTimeoutMs: 200, responseTimeoutMs: 3000, settleTimeoutMs: 130_000, blockEnvdInternal: true });
  const route = (ms: number) => ({ sandboxId: ID, port: 49983, pathAndQuery: `/slow?ms=${ms}` });
  try {
    // 800 ms: past the 200 ms connect and idle bounds, within the 3 s answer bound
    const get = await proxy.forward(new Request("http://x/slow"), route(800), null);
    expect(get.status).toBe(200);
    expect(await get.text()).toBe("slow answer");
    const post = await proxy.forward(new Request("http://x/slow", { method: "POST", body: new ReadableStream({ pull: (c) => (c.enqueue(new Uint8Array(10)), c.close()) }), duplex: "half" } as RequestInit), route(800), null);
    expect(post.status).toBe(200);
    expect(await post.text()).toBe("slow answer");
    // an answer that never comes in time is a 502 naming the answer bound
    const late = await proxy.forward(new Request("http://x/slow"), route(60_000), null);
    expect(late.status).toBe(502);
    expect(((await late.json()) as { message: string }).message).toBe("The request to port 49983 of the sandbox was cut: no response within 3000 ms");
  } finally {
    proxy.close();
  }
});

test("a 256 MiB upload through the node to a slow reader streams byte-exact and the node holds no more than a fraction of it (the proxy reads nothing ahead)", async () => {
  const CHUNK = 256 * 1024;
  const TOTAL = 256 << 20;
  const block = new Uint8Array(CHUNK).map((_, i) => (i * 31) & 0xff);
  const want = createHash("sha256");
  for (let sent = 0; sent < TOTAL; sent += CHUNK) want.update(block);
  Bun.gc(true);
  const before = process.memoryUsage.rss();
  let peak = before;
  let samples = 0;
  const sampler = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage.rss());
    samples++;
  }, 20);
  try {
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        if (sent >= TOTAL) return c.close();
        sent += CHUNK;
        c.enqueue(block);
      },
    });
    const r = await fetch(`${node.url}/slowsha`, { method: "POST", headers: hdr(), body, duplex: "half" } as RequestInit);
    expect(r.status).toBe(200);
    expect(await r.json()).toEqual({ n: TOTAL, sha: want.digest("hex") });
  } finally {
    clearInterval(sampler);
  }
  peak = Math.max(peak, process.memoryUsage.rss());
  expect(samples).toBeGreaterThan(10); // the upload took 64 x 30 ms at least: RSS was watched while it ran
  // client, node and guest share this process, whose RSS grows by 40-70 MiB of allocator churn
  // for 128, 256 or 512 MiB alike; a proxy that read ahead of the slow reader would hold most of
  // the 256 MiB (the client produces it in a fraction of the reader's 2 s)
  expect(peak - before).toBeLessThan(TOTAL / 2);
});

test("a 40 MiB upload at 1 MiB/s (over 40 s, past the 30 s connect bound) through the node into a real envd arrives whole; envd's RSS stays bounded (issue 16 item 2)", async () => {
  // a node of its own whose loopback guests leave envd's port free: a real envd child binds it
  const slow = await startNodeNoVm({}, undefined, { ports: [3000] });
  let envd: EnvdChild | undefined;
  const dir = mkdtempSync(join(tmpdir(), "slow-upload-"));
  try {
    const rec = await createLoopback(slow);
    envd = await startEnvdChild(undefined, {}, [], { host: slow.runtime!.hostOf(rec.id)!, port: 49983 });
    expect((await initEnvd(envd.url, { accessToken: rec.envdAccessToken, defaultUser: "root" })).status).toBe(204);
    const rssKiB = () => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${envd!.proc.pid}/status`, "utf8"))![1]);
    const headers = { "E2b-Sandbox-Id": rec.id, "E2b-Sandbox-Port": "49983", "x-access-token": rec.envdAccessToken!, "content-type": "application/octet-stream" };
    const post = (path: string, body: Uint8Array | ReadableStream<Uint8Array>) => fetch(`${slow.url}/files?path=${encodeURIComponent(path)}`, { method: "POST", headers, body, duplex: "half" } as RequestInit);
    // warm-up: envd's first upload compiles its path
    expect((await post(join(dir, "warm.bin"), new Uint8Array(4 << 20))).status).toBe(200);
    const CHUNK = 64 * 1024;
    const TOTAL = 40 << 20;
    const block = new Uint8Array(CHUNK).map((_, i) => (i * 13 + 5) & 0xff);
    const want = createHash("sha256");
    for (let n = 0; n < TOTAL; n += CHUNK) want.update(block);
    const rss0 = rssKiB();
    let peak = rss0;
    const sampler = setInterval(() => (peak = Math.max(peak, rssKiB())), 250);
    const t0 = performance.now();
    let sent = 0;
    try {
      const body = new ReadableStream<Uint8Array>({
        async pull(c) {
          if (sent >= TOTAL) return c.close();
          // paced at 1 MiB/s from the start (16 chunks a second)
          const due = t0 + (sent / (1 << 20)) * 1000;
          const wait = due - performance.now();
          if (wait > 0) await Bun.sleep(wait);
          sent += CHUNK;
          c.enqueue(block);
        },
      });
      const r = await post(join(dir, "slow.bin"), body);
      expect([r.status, await r.text()]).toEqual([200, JSON.stringify([{ path: join(dir, "slow.bin"), name: "slow.bin", type: "file" }])]);
    } finally {
      clearInterval(sampler);
    }
    const seconds = (performance.now() - t0) / 1000;
    const file = readFileSync(join(dir, "slow.bin"));
    expect(file.length).toBe(TOTAL);
    expect(createHash("sha256").update(file).digest("hex")).toBe(want.digest("hex"));
    expect(seconds).toBeGreaterThan(39); // paced: it did outlast the 30 s connect bound
    console.log(`slow upload: ${TOTAL >> 20} MiB in ${seconds.toFixed(1)} s through the node; envd RSS ${(rss0 / 1024).toFixed(1)} MiB -> peak ${(peak / 1024).toFixed(1)} MiB (+${((peak - rss0) / 1024).toFixed(1)})`);
    expect(peak - rss0).toBeLessThan(16 * 1024);
  } finally {
    await envd?.stop();
    await slow.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
}, 120_000);

test("connect_timeout_ms still bounds connecting for a request with a body: a POST to a port that never completes the handshake is cut by the connect bound, not the idle one", async () => {
  // a listener that never accepts, backlog 0, its accept queue filled: further SYNs are dropped,
  // so a connect to it stays pending (a black hole on loopback)
  const host = node.runtime!.hostOf(ID)!;
  const py = Bun.spawn(["python3", "-c", `import socket, time; s = socket.socket(); s.bind((${JSON.stringify(host)}, 0)); s.listen(0); print(s.getsockname()[1], flush=True); time.sleep(300)`], { stdout: "pipe" });
  const fill: Socket[] = [];
  const proxy = new SandboxProxy(node.orch, { domains: [], connectTimeoutMs: 1000, idleTimeoutMs: 60_000, settleTimeoutMs: 130_000, blockEnvdInternal: true });
  try {
    const reader = py.stdout.getReader();
    const port = Number(new TextDecoder().decode((await reader.read()).value).trim());
    for (let i = 0; i < 2; i++) fill.push(connect(port, host));
    // one handshake completes (the accept queue of backlog 0 holds one): the queue is full from then on
    await waitEvent("the accept queue to fill", Promise.race(fill.map((f) => new Promise((r) => f.once("connect", r)))));
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        c.enqueue(new Uint8Array(1024));
      },
    });
    const r = await proxy.forward(new Request("http://node/up", { method: "POST", body, duplex: "half" } as RequestInit), { sandboxId: ID, port, pathAndQuery: "/up" }, null);
    expect(r.status).toBe(502);
    expect(r.headers.get("x-agentenv-error-source")).toBe("proxy");
    expect(await r.json()).toEqual({ sandboxId: ID, code: 502, message: `The request to port ${port} of the sandbox was cut: not connected within 1000 ms` });
  } finally {
    proxy.close();
    for (const s of fill) s.destroy();
    py.kill();
    await py.exited;
  }
});

test("signed file URLs from the SDK (E2B_SANDBOX_URL = the node) reach the sandbox whose token signed them; bad or expired ones are 401 naming why (expired: E2B envd's words)", async () => {
  const a = await createLoopback(node);
  const b = await createLoopback(node);
  const opts = { apiUrl: node.url, apiKey: node.apiKey, sandboxUrl: node.url };
  try {
    const sa = await Sandbox.connect(a.id, opts);
    const sb = await Sandbox.connect(b.id, opts);
    const down = await sb.downloadUrl("/home/user/测试 文件.txt", { user: "user" });
    expect(down.startsWith(`${node.url}/files?`)).toBe(true);
    const r = await fetch(down);
    expect(r.status).toBe(200);
    expect(await r.json()).toEqual({ sandbox: b.id, method: "GET", path: "/home/user/测试 文件.txt", signatureValid: true });
    const up = await sa.uploadUrl("/tmp/up.bin", { user: "user", useSignatureExpiration: 600 });
    const w = await fetch(up, { method: "POST", body: "x" });
    expect(await w.json()).toEqual({ sandbox: a.id, method: "POST", path: "/tmp/up.bin", signatureValid: true });
    // a write URL does not read, a tampered signature matches no token: 401 naming the request
    const asRead = await fetch(up);
    expect(asRead.status).toBe(401);
    expect(asRead.headers.get("x-agentenv-error-source")).toBe("proxy");
    expect(((await asRead.json()) as { message: string }).message).toStartWith(`invalid file signature: no sandbox's access token signs read of "/tmp/up.bin" for user "user" until `);
    const tampered = new URL(down);
    tampered.searchParams.set("signature", `v1_${"A".repeat(43)}`);
    expect((await fetch(tampered)).status).toBe(401);
    // expired (signed 10 s in the past): 401 with E2B envd's words
    const old = await sb.downloadUrl("/etc/hostname", { user: "user", useSignatureExpiration: -10 });
    const expired = await fetch(old);
    expect([expired.status, await expired.json()]).toEqual([401, { code: 401, message: "signature is already expired" }]);
    const badExp = new URL(down);
    badExp.searchParams.set("signature_expiration", "soon");
    const be = await fetch(badExp);
    expect([be.status, ((await be.json()) as { message: string }).message]).toEqual([401, 'invalid signature_expiration "soon": expected unix seconds']);
    // after a kill, its URLs match no live sandbox
    await node.orch.kill(b.id);
    expect((await fetch(down)).status).toBe(401);
  } finally {
    await node.orch.kill(a.id);
  }
});

test("with [sandbox_proxy] tls_cert_path and tls_key_path, host routes and the API are served over HTTPS too", async () => {
  const dir = mkdtempSync(join(tmpdir(), "proxy-tls-"));
  const cert = join(dir, "cert.pem");
  const key = join(dir, "key.pem");
  const gen = Bun.spawnSync(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=agentenv.test", "-addext", "subjectAltName=DNS:*.agentenv.test,IP:127.0.0.1", "-keyout", key, "-out", cert], { stderr: "pipe" });
  expect(gen.exitCode).toBe(0);
  const tlsEnv = { AENV_SANDBOX_PROXY_DOMAINS: "agentenv.test", AENV__sandbox_proxy__tls_cert_path: cert, AENV__sandbox_proxy__tls_key_path: key, AENV__sandbox_proxy__https_addr: "127.0.0.1:0" };
  const n = await startNodeNoVm(tlsEnv, undefined, { fetch: guest, ports: [49983, 3000] });
  try {
    expect(n.httpsPort).toBeGreaterThan(0);
    const id = (await createLoopback(n)).id;
    const ca = await Bun.file(cert).text();
    const r = await fetch(`https://127.0.0.1:${n.httpsPort}/over/tls`, { headers: { host: `3000-${id}.agentenv.test` }, tls: { ca } } as RequestInit);
    expect(r.status).toBe(200);
    expect(await r.json()).toMatchObject({ sandbox: id, port: "3000", path: "/over/tls" });
    const health = await fetch(`https://127.0.0.1:${n.httpsPort}/health`, { tls: { ca } } as RequestInit);
    expect(health.status).toBe(200);
    // a client that does not trust the certificate is refused by TLS, not served in the clear
    await expect(fetch(`https://127.0.0.1:${n.httpsPort}/health`)).rejects.toThrow();
  } finally {
    await n.dispose();
  }
  // half a configuration, a missing file, a file that is not PEM and a key of another certificate
  // each stop start-up naming the key
  await expect(startNodeNoVm({ AENV__sandbox_proxy__tls_cert_path: cert })).rejects.toMatchObject({ code: "config.bad_value", details: { key: "sandbox_proxy.tls_key_path" } });
  const tlsWith = (c: string, k: string) => startNodeNoVm({ ...tlsEnv, AENV__sandbox_proxy__tls_cert_path: c, AENV__sandbox_proxy__tls_key_path: k });
  const missing = join(dir, "missing.pem");
  await expect(tlsWith(missing, key)).rejects.toMatchObject({ code: "config.unreadable", details: { key: "sandbox_proxy.tls_cert_path", path: missing } });
  const garbage = join(dir, "garbage.pem");
  writeFileSync(garbage, "not a certificate\n");
  await expect(tlsWith(garbage, key)).rejects.toMatchObject({ code: "config.bad_value", details: { key: "sandbox_proxy.tls_cert_path", value: garbage, expected: "a PEM certificate" } });
  await expect(tlsWith(cert, garbage)).rejects.toMatchObject({ code: "config.bad_value", details: { key: "sandbox_proxy.tls_key_path", value: garbage, expected: "a PEM private key" } });
  const otherKey = join(dir, "other-key.pem");
  expect(Bun.spawnSync(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", otherKey], { stderr: "pipe" }).exitCode).toBe(0);
  const mismatch = await tlsWith(cert, otherKey).catch((e: unknown) => e);
  expect(mismatch).toMatchObject({ code: "config.bad_value", details: { key: "sandbox_proxy.tls_key_path", value: otherKey } });
  expect((mismatch as Error).message).toBe(`config: sandbox_proxy.tls_key_path ${otherKey}: expected the private key of the certificate in ${cert}`);
  rmSync(dir, { recursive: true, force: true });
});

test("the route table follows create, pause, resume and kill; proxied requests read no database", async () => {
  const proxy = new SandboxProxy(node.orch, { domains: [], connectTimeoutMs: 2000, idleTimeoutMs: 2000, settleTimeoutMs: 130_000, blockEnvdInternal: true });
  try {
    const rec = await createLoopback(node, { network: { allowPublicTraffic: false } });
    const id = rec.id;
    const route = () => proxy.routes.get(id);
    expect(route()).toEqual({ id, state: "running", host: node.runtime!.hostOf(id)!, trafficAccessToken: rec.trafficAccessToken, envdAccessToken: rec.envdAccessToken, autoResume: false, snapshotKind: null, maskRequestHost: null, httpsPorts: [] });
    expect(rec.trafficAccessToken).toMatch(/.{16,}/);
    await node.orch.pause(id);
    expect(route()).toMatchObject({ state: "paused", host: null });
    const gate = node.runtime!.gate("resume");
    const resumed = node.orch.connect(id);
    await gate.reached;
    expect(route()).toMatchObject({ state: "resuming", host: null });
    gate.open();
    await resumed;
    expect(route()).toMatchObject({ state: "running", host: node.runtime!.hostOf(id)! });
    // a second proxy seeds its table from the live sandboxes
    const late = new SandboxProxy(node.orch, { domains: [], connectTimeoutMs: 2000, idleTimeoutMs: 2000, settleTimeoutMs: 130_000, blockEnvdInternal: true });
    expect(late.routes.get(id)).toEqual(route()!);
    late.close();
    // no store or orchestrator read per proxied request: reads made from the API's code (src/api)
    // are counted (the node's own timers, such as the metrics sampler's, may read the store meanwhile)
    const o = node.orch as unknown as { get: (id: string) => unknown; store: { get: (id: string) => unknown; inStates: (s: unknown) => unknown } };
    const counts = { get: 0, storeGet: 0, inStates: 0 };
    const fromProxy = () => /\/src\/api\//.test(new Error().stack ?? "");
    const saved = { get: o.get, storeGet: o.store.get, inStates: o.store.inStates };
    o.get = (...a) => (fromProxy() && counts.get++, saved.get.apply(node.orch, a));
    o.store.get = (...a) => (fromProxy() && counts.storeGet++, saved.storeGet.apply(o.store, a));
    o.store.inStates = (...a) => (fromProxy() && counts.inStates++, saved.inStates.apply(o.store, a));
    try {
      for (let i = 0; i < 20; i++) expect((await fetch(`${node.url}/n${i}`, { headers: hdr(49983, id) })).status).toBe(200);
    } finally {
      Object.assign(o, { get: saved.get });
      Object.assign(o.store, { get: saved.storeGet, inStates: saved.inStates });
    }
    expect(counts).toEqual({ get: 0, storeGet: 0, inStates: 0 });
    await node.orch.kill(id);
    expect(route()).toBeUndefined();
    expect(proxy.routes.get(ID)).toMatchObject({ state: "running" });
  } finally {
    proxy.close();
  }
});

test("a sandbox created with allowPublicTraffic=false: its user ports need e2b-traffic-access-token, envd's port does not", async () => {
  const priv = await createLoopback(node, { network: { allowPublicTraffic: false } });
  const secret = priv.trafficAccessToken!;
  const h = (port: number, extra: Record<string, string> = {}) => ({ "e2b-sandbox-id": priv.id, "e2b-sandbox-port": String(port), ...extra });
  const none = await fetch(`${node.url}/teapot`, { headers: h(3000) });
  expect(none.status).toBe(403);
  expect(none.headers.get("x-agentenv-error-source")).toBe("proxy");
  expect(((await none.json()) as any).message).toContain("e2b-traffic-access-token");
  expect((await fetch(`${node.url}/teapot`, { headers: h(3000, { "e2b-traffic-access-token": "wrong" }) })).status).toBe(403);
  expect((await fetch(`${node.url}/teapot`, { headers: h(3000, { "e2b-traffic-access-token": secret }) })).status).toBe(418);
  // envd (49983) is guarded by the envd access token instead
  expect((await fetch(`${node.url}/teapot`, { headers: h(49983) })).status).toBe(418);
  // WebSocket upgrades are checked too
  const ws = await fetch(`${node.url}/ws`, { headers: h(3000, { upgrade: "websocket", connection: "Upgrade", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", "sec-websocket-version": "13" }) });
  expect(ws.status).toBe(403);
});

test("allowPublicTraffic=false needs the traffic token through every route: headers, {port}-{id}.{domain}, /proxy/{id}/{port}/, x-agentenv-sandbox-id", async () => {
  const priv = await createLoopback(node, { network: { allowPublicTraffic: false } });
  const tok = { "e2b-traffic-access-token": priv.trafficAccessToken! };
  const routes: [string, Record<string, string>][] = [
    [`${node.url}/teapot`, { "e2b-sandbox-id": priv.id, "e2b-sandbox-port": "3000" }],
    [`${node.url}/teapot`, { "x-agentenv-sandbox-id": priv.id, "x-agentenv-sandbox-port": "3000" }],
    [`${node.url}/teapot`, { host: `3000-${priv.id}.agentenv.test` }],
    [`${node.url}/proxy/${priv.id}/3000/teapot`, {}],
  ];
  for (const [url, h] of routes) {
    const without = await fetch(url, { headers: h });
    expect([JSON.stringify(h), without.status, without.headers.get("x-agentenv-error-source")]).toEqual([JSON.stringify(h), 403, "proxy"]);
    expect((await fetch(url, { headers: { ...h, "e2b-traffic-access-token": "wrong" } })).status).toBe(403);
    expect((await fetch(url, { headers: { ...h, ...tok } })).status).toBe(418);
  }
});

test("maskRequestHost: requests into the sandbox carry that Host with ${PORT} replaced, on every route; unmasked sandboxes keep the node's", async () => {
  const masked = await createLoopback(node, { network: { maskRequestHost: "app-${PORT}.internal.example:${PORT}" } });
  const hostSeen = async (url: string, h: Record<string, string>) => ((await (await fetch(url, { headers: h })).json()) as { headers: Record<string, string> }).headers.host;
  expect(await hostSeen(`${node.url}/h`, { "e2b-sandbox-id": masked.id, "e2b-sandbox-port": "3000" })).toBe("app-3000.internal.example:3000");
  expect(await hostSeen(`${node.url}/h`, { "e2b-sandbox-id": masked.id })).toBe("app-49983.internal.example:49983");
  expect(await hostSeen(`${node.url}/proxy/${masked.id}/3000/h`, {})).toBe("app-3000.internal.example:3000");
  expect(await hostSeen(`${node.url}/h`, { host: `3000-${masked.id}.agentenv.test` })).toBe("app-3000.internal.example:3000");
  expect(await hostSeen(`${node.url}/h`, { "e2b-sandbox-id": ID, "e2b-sandbox-port": "3000" })).toMatch(/^127\.[0-9.]+:3000$/);
});
