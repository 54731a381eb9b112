import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync, statSync, writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { writeManifest } from "../../src/template/index.ts";
import { SandboxStore } from "../../src/orchestrator/store.ts";
import { Sandbox } from "e2b";
import { api, createLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";
import { waitFor } from "../helpers/wait.ts";

let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm({}, undefined, {});
});
afterAll(async () => {
  await node.dispose();
});

async function json(res: Response): Promise<{ status: number; body: any }> {
  return { status: res.status, body: await res.json() };
}

test("API key: generated on first start as e2b_<40 hex> in $home/api-key (0600), reused on restart", async () => {
  expect(node.apiKeySource).toBe("generated");
  expect(node.apiKey).toMatch(/^e2b_[0-9a-f]{40}$/);
  const file = join(node.home, "api-key");
  expect(readFileSync(file, "utf8").trim()).toBe(node.apiKey);
  expect(statSync(file).mode & 0o777).toBe(0o600);
  const other = await startNodeNoVm({}, node.home + "-2");
  await other.close(); // one node per runtime path at a time
  const again = await startNodeNoVm({ AENV_HOME_PATH: node.home + "-2" }, node.home + "-2");
  try {
    expect(again.apiKeySource).toBe("file");
    expect(again.apiKey).toBe(other.apiKey);
  } finally {
    await again.dispose();
  }
});

test("AENV_API_KEY overrides the stored key", async () => {
  const n = await startNodeNoVm({ AENV_API_KEY: "e2b_abc123" });
  try {
    expect(n.apiKeySource).toBe("config");
    expect((await api(n, "/v2/sandboxes", { key: "e2b_abc123" })).status).toBe(200);
    const r = await api(n, "/v2/sandboxes", { key: n.apiKey + "x" });
    expect(r.status).toBe(401);
    // nothing of where the key is configured goes to a client that has not shown it
    expect(((await r.json()) as any).message).toBe("Invalid API key: send this node's key in the X-API-Key header");
  } finally {
    await n.dispose();
  }
});

test("401 without or with a wrong X-API-Key, E2B error body; /health needs no key", async () => {
  for (const key of [null, "", "e2b_0000", node.apiKey.toUpperCase()]) {
    const r = await json(await api(node, "/v2/sandboxes", { key }));
    expect(r.status).toBe(401);
    expect(r.body.code).toBe(401);
    // no server path for a client that has not shown the key (the banner and the log name the file)
    expect(r.body.message).toBe("Invalid API key: send this node's key in the X-API-Key header");
    expect(JSON.stringify(r.body)).not.toContain(node.home);
  }
  const h = await api(node, "/health", { key: null });
  expect(h.status).toBe(200);
  expect(((await h.json()) as any).status).toBe("ok");
  // header name is case-insensitive (the SDK sends X-API-KEY)
  expect((await fetch(node.url + "/v2/sandboxes", { headers: { "X-API-KEY": node.apiKey } })).status).toBe(200);
});

test("create: malformed JSON, missing/invalid fields are 400; unknown template is 404 as E2B", async () => {
  for (const path of ["/v2/sandboxes", "/sandboxes"]) {
    const bad = await json(await api(node, path, { method: "POST", body: "{not json" }));
    expect(bad).toMatchObject({ status: 400, body: { code: 400 } });
    expect((await json(await api(node, path, { method: "POST", body: "{}" }))).status).toBe(400);
    expect((await json(await api(node, path, { method: "POST", body: JSON.stringify({ templateID: "base", timeout: "30" }) }))).status).toBe(400);
    expect((await json(await api(node, path, { method: "POST", body: JSON.stringify({ templateID: "base", timeout: 1.5 }) }))).status).toBe(400);
    expect((await json(await api(node, path, { method: "POST", body: JSON.stringify({ templateID: "base", metadata: { a: 1 } }) }))).status).toBe(400);
    const unknown = await json(await api(node, path, { method: "POST", body: JSON.stringify({ templateID: "no-such-template" }) }));
    expect(unknown).toEqual({ status: 404, body: { code: 404, message: "template 'no-such-template' not found", error_code: "orchestrator.template_not_found" } });
  }
  const net = await json(await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", network: { allowOut: ["10.0.0.300"] } }) }));
  expect(net).toMatchObject({ status: 400, body: { code: 400, message: expect.stringContaining("10.0.0.300") } });
  // no row was left behind by the refused creates
  expect(node.orch.store.countByState()).toEqual({});
});

test("fields this node does not implement are refused with 400 api.unsupported naming the field, never ignored", async () => {
  const create: [Record<string, unknown>, string][] = [
    [{ mcp: { server: {} } }, "mcp"],
    [{ iam: { role: "x" } }, "iam"],
  ];
  for (const [extra, field] of create) {
    for (const path of ["/v2/sandboxes", "/sandboxes"]) {
      const r = await json(await api(node, path, { method: "POST", body: JSON.stringify({ templateID: "base", ...extra }) }));
      expect(r).toEqual({ status: 400, body: { code: 400, message: expect.stringContaining(`${field}:`), error_code: "api.unsupported" } });
    }
  }
  // network.rules, egressProxy and maskRequestHost are implemented: malformed ones are a 400 naming the field
  const network: [Record<string, unknown>, string][] = [
    [{ egressProxy: { url: "http://p" } }, "network.egressProxy.url"],
    [{ rules: [{ host: "a" }] }, "network.rules"],
  ];
  for (const [n, field] of network) {
    const r = await json(await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", network: n }) }));
    expect(r).toEqual({ status: 400, body: { code: 400, message: expect.stringContaining(`${field}:`), error_code: "orchestrator.bad_request" } });
  }
  // defaults and empty values are fine (checked against a missing template: 404, not 400)
  const ok = await json(await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "nope", volumeMounts: [], autoPauseMemory: true, mcp: null }) }));
  expect(ok.status).toBe(404);
  const { id } = await createLoopback(node);
  for (const [path, body] of [[`/sandboxes/${id}/resume`, { autoPause: true }]] as const) {
    const r = await json(await api(node, path, { method: "POST", body: JSON.stringify(body) }));
    expect(r.status).toBe(400);
    expect(r.body.error_code).toBe("api.unsupported");
  }
  // the refused pause did nothing
  expect((await json(await api(node, `/sandboxes/${id}`))).body.state).toBe("running");
  expect(node.orch.getCounters()).toMatchObject({ running: 1, paused: 0 });
  expect((await api(node, `/sandboxes/${id}`, { method: "DELETE" })).status).toBe(204);
});

test("routes on a missing or malformed sandbox id answer 404 {code:404}", async () => {
  const calls: [string, string, unknown?][] = [
    ["GET", "/sandboxes/abc123"],
    ["DELETE", "/sandboxes/abc123"],
    ["POST", "/sandboxes/abc123/pause", {}],
    ["POST", "/sandboxes/abc123/resume", {}],
    ["POST", "/v2/sandboxes/abc123/connect", {}],
    ["POST", "/sandboxes/abc123/connect", { timeout: 10 }],
    ["POST", "/sandboxes/abc123/timeout", { timeout: 10 }],
    ["POST", "/sandboxes/abc123/refreshes", { duration: 10 }],
    ["PUT", "/sandboxes/abc123/network", { allowOut: [] }],
    ["GET", "/sandboxes/BAD-ID.x"],
    ["DELETE", "/sandboxes/..%2F..%2Fetc"],
  ];
  for (const [method, path, body] of calls) {
    const r = await json(await api(node, path, { method, body: body === undefined ? undefined : JSON.stringify(body) }));
    expect({ path, ...r }).toMatchObject({ path, status: 404, body: { code: 404 } });
  }
  expect((await json(await api(node, "/no/such/route"))).status).toBe(404);
});

test("v1 connect requires timeout; timeout bodies are validated", async () => {
  const { id } = await createLoopback(node);
  expect((await api(node, `/sandboxes/${id}/connect`, { method: "POST", body: "{}" })).status).toBe(400);
  expect((await api(node, `/sandboxes/${id}/timeout`, { method: "POST", body: JSON.stringify({ timeout: -1 }) })).status).toBe(400);
  expect((await api(node, `/sandboxes/${id}/timeout`, { method: "POST", body: JSON.stringify({ timeout: 86401 }) })).status).toBe(400);
  expect((await api(node, `/sandboxes/${id}/refreshes`, { method: "POST", body: JSON.stringify({ duration: 3601 }) })).status).toBe(400);
  await node.orch.kill(id);
});

test("get, timeout, refresh, connect and resume on a running sandbox", async () => {
  const rec = await createLoopback(node, { metadata: { user: "a b" }, timeoutSecs: 60 });
  const id = rec.id;
  const tok = rec.envdAccessToken!;
  const d = await json(await api(node, `/sandboxes/${id}`));
  expect(d.status).toBe(200);
  expect(d.body).toMatchObject({ sandboxID: id, templateID: "base", alias: "base", clientID: "6532622b", state: "running", cpuCount: 1, memoryMB: 512, diskSizeMB: 2048, envdVersion: "0.5.7", envdAccessToken: tok, metadata: { user: "a b" }, lifecycle: { autoResume: false, onTimeout: "kill" } });
  expect(Date.parse(d.body.startedAt)).toBeGreaterThan(0);

  const t0 = Date.now();
  expect((await api(node, `/sandboxes/${id}/timeout`, { method: "POST", body: JSON.stringify({ timeout: 30 }) })).status).toBe(204);
  let end = Date.parse((await json(await api(node, `/sandboxes/${id}`))).body.endAt);
  expect(end).toBeGreaterThanOrEqual(t0 + 29_000);
  expect(end).toBeLessThanOrEqual(Date.now() + 30_000);

  // refresh never shortens
  expect((await api(node, `/sandboxes/${id}/refreshes`, { method: "POST", body: JSON.stringify({ duration: 5 }) })).status).toBe(204);
  expect(Date.parse((await json(await api(node, `/sandboxes/${id}`))).body.endAt)).toBe(end);

  // connect on a running sandbox: 200, TTL extended only when later
  const beforeConnect = Date.now();
  const c = await json(await api(node, `/v2/sandboxes/${id}/connect`, { method: "POST", body: JSON.stringify({ timeout: 600 }) }));
  const afterConnect = Date.now();
  expect(c.status).toBe(200);
  expect(c.body).toMatchObject({ sandboxID: id, templateID: "base", envdAccessToken: tok, envdVersion: "0.5.7", clientID: "6532622b" });
  end = Date.parse((await json(await api(node, `/sandboxes/${id}`))).body.endAt);
  // 600 s from the moment the node handled the connect, which lies between these two
  expect(end).toBeGreaterThanOrEqual(beforeConnect + 600_000);
  expect(end).toBeLessThanOrEqual(afterConnect + 600_000);
  // v1 connect (timeout required) on a running sandbox: 200
  expect((await api(node, `/sandboxes/${id}/connect`, { method: "POST", body: JSON.stringify({ timeout: 60 }) })).status).toBe(200);
  // an empty body is accepted by v2 connect (the SDK sends {})
  expect((await api(node, `/v2/sandboxes/${id}/connect`, { method: "POST" })).status).toBe(200);

  // the deprecated resume of a running sandbox is a conflict
  const r = await json(await api(node, `/sandboxes/${id}/resume`, { method: "POST", body: "{}" }));
  expect(r).toMatchObject({ status: 409, body: { code: 409 } });
  await node.orch.kill(id);
});

test("metadata filters with spaces, /, =, &, %, + and unicode match through the E2B SDK's own Sandbox.list", async () => {
  const odd = { "team name": "blue/green", "a=b&c": "x&y=z", pct: "100% sure", plus: "1+1", "ключ": "значение 🤣" };
  const mine = (await createLoopback(node, { metadata: { ...odd, other: "keep" } })).id;
  const decoy = (await createLoopback(node, { metadata: { "team name": "blue green", pct: "100%25 sure" } })).id;
  const opts = { apiUrl: node.url, apiKey: node.apiKey };
  try {
    for (const [k, v] of Object.entries(odd)) {
      const found = await Sandbox.list({ ...opts, query: { metadata: { [k]: v } } }).nextItems();
      expect([k, found.map((s) => s.sandboxId)]).toEqual([k, [mine]]);
      expect(found[0]!.metadata).toEqual({ ...odd, other: "keep" });
    }
    const all = await Sandbox.list({ ...opts, query: { metadata: odd } }).nextItems();
    expect(all.map((s) => s.sandboxId)).toEqual([mine]);
    const other = await Sandbox.list({ ...opts, query: { metadata: { "team name": "blue green" } } }).nextItems();
    expect(other.map((s) => s.sandboxId)).toEqual([decoy]);
  } finally {
    await node.orch.kill(mine);
    await node.orch.kill(decoy);
  }
});

test("list: state and metadata filters (SDK double encoding), order, pagination with X-Next-Token", async () => {
  const ids: string[] = [];
  for (let i = 0; i < 7; i++) {
    // one per millisecond at least: list order is by start time
    const t = Date.now();
    await waitFor("the clock to move on", () => Date.now() !== t);
    ids.push((await createLoopback(node, { metadata: { user: i % 2 ? "a b" : "c&d=e", idx: String(i) } })).id);
  }
  const [list0, list1, list2, list3, list4, list5, list6] = ids as [string, string, string, string, string, string, string];
  await node.orch.pause(list5);
  const all = await api(node, "/v2/sandboxes?limit=100");
  expect(all.status).toBe(200);
  expect(all.headers.get("x-total-running")).toBe("6");
  expect(all.headers.get("x-next-token")).toBeNull();
  // newest first by default (E2B)
  expect(((await all.json()) as { sandboxID: string }[]).map((s) => s.sandboxID)).toEqual([...ids].reverse());

  // the SDK encodes each key/value, joins with &, and encodes the whole thing again
  const md = (o: Record<string, string>) => encodeURIComponent(Object.entries(o).map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&"));
  const odd = await json(await api(node, `/v2/sandboxes?metadata=${md({ user: "a b" })}&state=running`));
  expect(odd.body.map((s: { sandboxID: string }) => s.sandboxID)).toEqual([list3, list1]);
  const amp = await json(await api(node, `/v2/sandboxes?metadata=${md({ user: "c&d=e", idx: "4" })}`));
  expect(amp.body.map((s: { sandboxID: string }) => s.sandboxID)).toEqual([list4]);
  const paused = await json(await api(node, `/v2/sandboxes?state=paused`));
  expect(paused.body).toHaveLength(1);
  expect(paused.body[0]).toMatchObject({ sandboxID: list5, state: "paused" });
  // the deprecated list shows running ones only
  const v1 = await json(await api(node, `/sandboxes`));
  expect(v1.body.map((s: { sandboxID: string }) => s.sandboxID)).toEqual(ids.filter((i) => i !== list5).reverse());

  const pages: string[][] = [];
  let token: string | null = null;
  do {
    const r: Response = await api(node, `/v2/sandboxes?limit=3&order=desc${token ? `&nextToken=${token}` : ""}`);
    expect(r.status).toBe(200);
    pages.push(((await r.json()) as { sandboxID: string }[]).map((s) => s.sandboxID));
    token = r.headers.get("x-next-token");
  } while (token);
  expect(pages).toEqual([[list6, list5, list4], [list3, list2, list1], [list0]]);

  for (const q of ["limit=0", "limit=101", "limit=x", "state=dead", "order=up", "nextToken=zzz", "startedAfter=yesterday", `metadata=${encodeURIComponent("novalue")}`, `metadata=${encodeURIComponent("k=%E0%A4%A")}`, `metadata=${encodeURIComponent("=v")}`]) {
    const r = await json(await api(node, `/v2/sandboxes?${q}`));
    expect({ q, ...r }).toMatchObject({ q, status: 400, body: { code: 400 } });
  }
  for (const id of ids) await node.orch.kill(id);
  expect(await (await api(node, "/v2/sandboxes")).json()).toEqual([]);
});

test("concurrent kills of one sandbox: exactly one 204, the rest 404; kill of a killed one is 404", async () => {
  const race1 = (await createLoopback(node)).id;
  const codes = await Promise.all(Array.from({ length: 6 }, () => api(node, `/sandboxes/${race1}`, { method: "DELETE" }).then((r) => r.status)));
  expect(codes.filter((c) => c === 204)).toHaveLength(1);
  expect(codes.filter((c) => c === 404)).toHaveLength(5);
  const metrics = await (await api(node, "/metrics", { key: null })).text();
  expect(metrics).toContain("# TYPE agentenv_sandbox_kills_total counter\n");
  expect(Number(/^agentenv_sandbox_kills_total (\d+)$/m.exec(metrics)![1])).toBeGreaterThanOrEqual(1);
  expect(metrics).toMatch(/^agentenv_sandboxes_running \d+$/m);
  expect(metrics).toMatch(/^# HELP agentenv_uptime_seconds Seconds since the node process started\.\n# TYPE agentenv_uptime_seconds gauge\nagentenv_uptime_seconds \d+$/m);
  // every metric has HELP and TYPE
  const names = [...metrics.matchAll(/^(agentenv_\w+) /gm)].map((m) => m[1]);
  for (const n of names) expect(metrics).toContain(`# HELP ${n} `);
  const again = await json(await api(node, `/sandboxes/${race1}`, { method: "DELETE" }));
  expect(again).toEqual({ status: 404, body: { code: 404, message: expect.stringContaining(race1), error_code: "orchestrator.not_found" } });
  expect(node.runtime!.calls.filter((c) => c === `kill:${race1}`)).toHaveLength(1);
});

test("templates come from the template store; nodes describe this node", async () => {
  const dir = join(node.home, "templates", "tpl1");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "rootfs.ext4"), Buffer.alloc(0));
  writeManifest(node.home, { name: "tpl1", rootfs: "rootfs.ext4", layers: [], bootArgs: "root=/dev/vda", diskBytes: 2048 * 1024 * 1024, buildKey: "k".repeat(40), createdAt: "2026-11-29T10:00:00.000Z" });
  const t = await json(await api(node, "/templates"));
  expect(t.status).toBe(200);
  // (the loopback guests' own template "base" is listed too)
  expect(t.body.filter((x: { templateID: string }) => x.templateID !== "base")).toEqual([
    expect.objectContaining({ templateID: "tpl1", aliases: ["tpl1"], names: ["tpl1"], diskSizeMB: 2048, cpuCount: 1, memoryMB: 512, buildStatus: "ready", public: true, createdAt: "2026-11-29T10:00:00.000Z" }),
  ]);
  // spawn statistics come from the node database (the orchestrator bumps them on each create)
  new SandboxStore(node.db).recordSpawn("tpl1", Date.parse("2026-11-29T11:00:00.000Z"));
  new SandboxStore(node.db).recordSpawn("tpl1", Date.parse("2026-11-29T11:30:00.000Z"));
  const t2 = await json(await api(node, "/v2/templates"));
  expect(t2.body.find((x: { templateID: string }) => x.templateID === "tpl1")).toMatchObject({ templateID: "tpl1", spawnCount: 2, lastSpawnedAt: "2026-11-29T11:30:00.000Z" });
  expect(t.body.find((x: { templateID: string }) => x.templateID === "tpl1")).toMatchObject({ spawnCount: 0, lastSpawnedAt: null });
  const nodes = await json(await api(node, "/nodes"));
  expect(nodes.body).toHaveLength(1);
  expect(nodes.body[0]).toMatchObject({ status: "ready", clusterID: "local", sandboxStartingCount: 0 });
  // the commit of this checkout (tests run from a git clone)
  expect(nodes.body[0].commit).toMatch(/^[0-9a-f]{40}$/);
  const cpu = nodes.body[0].metrics.cpuPercent;
  expect(Number.isInteger(cpu) && cpu >= 0 && cpu <= 100).toBe(true);
  expect((await json(await api(node, `/nodes/${nodes.body[0].id}`))).body.id).toBe(nodes.body[0].id);
  expect((await json(await api(node, "/nodes/other"))).status).toBe(404);
});

test("OpenAPI at /openapi.json and an explorer at /docs that loads only assets served by the node", async () => {
  const spec = await json(await api(node, "/openapi.json", { key: null }));
  expect(spec.status).toBe(200);
  expect(spec.body.openapi).toMatch(/^3\./);
  for (const p of ["/v2/sandboxes", "/sandboxes", "/sandboxes/{sandboxID}", "/sandboxes/{sandboxID}/pause", "/v2/sandboxes/{sandboxID}/connect", "/templates", "/nodes", "/health"]) {
    expect(Object.keys(spec.body.paths)).toContain(p);
  }
  const html = await (await api(node, "/docs", { key: null })).text();
  expect(html).toContain("/_assets/scalar.js");
  const srcs = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!);
  expect(srcs.filter((s) => /^(https?:)?\/\//.test(s))).toEqual([]);
  // the explorer's configuration: no default fonts (fonts.scalar.com), no request proxy
  const attr = /data-configuration='([^']*)'/.exec(html);
  expect(attr).not.toBeNull();
  const conf = JSON.parse(attr![1]!);
  expect(conf).toMatchObject({ cdn: "/_assets/scalar.js", withDefaultFonts: false, proxyUrl: "", externalUrls: { proxyUrl: "" } });
  const { content: _spec, ...settings } = conf;
  expect(JSON.stringify(settings)).not.toMatch(/https?:\/\//);
  // nor anywhere else in the page (scripts, styles, font faces)
  expect(html.replace(attr![0], "")).not.toMatch(/https?:\/\/|fonts\.scalar\.com|proxy\.scalar\.com/);
  const js = await api(node, "/_assets/scalar.js", { key: null });
  expect(js.status).toBe(200);
  expect(js.headers.get("content-type")).toContain("javascript");
  expect((await js.arrayBuffer()).byteLength).toBeGreaterThan(1_000_000);
});

test("at max_sandboxes a create is 429 with Retry-After (the SDKs retry it) and leaves nothing behind", async () => {
  const n = await startNodeNoVm({ AENV__orchestrator__max_sandboxes: "1" }, undefined, {});
  try {
    const dir = join(n.home, "templates", "tpl2");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "rootfs.ext4"), Buffer.alloc(0));
    writeManifest(n.home, { name: "tpl2", rootfs: "rootfs.ext4", layers: [], bootArgs: "", diskBytes: 1 << 20, buildKey: "k", createdAt: "2026-11-29T10:00:00.000Z" });
    await createLoopback(n);
    const r = await api(n, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "tpl2" }) });
    expect(r.status).toBe(429);
    expect(r.headers.get("retry-after")).toBe("1");
    expect(await r.json()).toMatchObject({ code: 429, error_code: "orchestrator.capacity" });
    expect(n.orch.getCounters()).toMatchObject({ running: 1, starting: 0, created: 1 });
    expect(n.runtime!.calls.filter((c) => c.startsWith("start:"))).toHaveLength(1);
  } finally {
    await n.dispose();
  }
});
