/**
 * Sandbox metrics and logs over the real node (API, orchestrator, SQLite) without VMs: sandboxes
 * are loopback guests whose envd answers `/metrics` as envd does; log lines enter through the
 * runtime's log sink as a VM's console would.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { api, createLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";
import type { GuestFetch } from "../helpers/loopback-runtime.ts";
import { consoleLogLine } from "../../src/sandbox/console-lines.ts";
import { splitUtf8 } from "../../src/orchestrator/logs.ts";
import { waitFor } from "../helpers/wait.ts";

let node: TestNode;
let envdCalls = 0;
const seenTokens: (string | null)[] = [];

/** The guests' envd: `/metrics` as envd answers it. */
const guest: GuestFetch = (req) => {
  if (new URL(req.url).pathname !== "/metrics") return new Response("no", { status: 404 });
  envdCalls++;
  seenTokens.push(req.headers.get("x-access-token"));
  return Response.json({
    ts: 1,
    cpu_count: 2,
    cpu_used_pct: 37.5 + envdCalls,
    mem_total: 512 * 1048576,
    mem_used: 100 * 1048576,
    mem_cache: 20 * 1048576,
    mem_total_mib: 512,
    mem_used_mib: 100,
    disk_used: 700 * 1048576,
    disk_total: 2048 * 1048576,
  });
};

beforeAll(async () => {
  node = await startNodeNoVm(
    { AENV__metrics__sample_interval_ms: "100", AENV__metrics__idle_sample_interval_ms: "0", AENV__logs__max_entries_per_sandbox: "50", AENV__logs__max_line_bytes: "64" },
    undefined,
    { fetch: guest },
  );
});
afterAll(async () => {
  await node.dispose();
});

async function json(res: Response): Promise<{ status: number; body: any }> {
  return { status: res.status, body: await res.json() };
}

test("metrics: sampled from envd with the sandbox's token; GET by interval, several at once, Prometheus gauges", async () => {
  const rec = await createLoopback(node);
  const metr1 = rec.id;
  const samples = await waitFor("3 samples", async () => {
    const r = await json(await api(node, `/sandboxes/${metr1}/metrics`));
    expect(r.status).toBe(200);
    return r.body.length >= 3 ? (r.body as any[]) : undefined;
  });
  expect(rec.envdAccessToken).toMatch(/.{16,}/);
  expect(seenTokens.every((t) => t === rec.envdAccessToken)).toBe(true);
  const s = samples[0];
  expect(Object.keys(s).sort()).toEqual(["cpuCount", "cpuUsedPct", "diskTotal", "diskUsed", "memCache", "memTotal", "memUsed", "timestamp", "timestampUnix"]);
  expect(s).toMatchObject({ cpuCount: 2, memTotal: 512 * 1048576, memUsed: 100 * 1048576, memCache: 20 * 1048576, diskUsed: 700 * 1048576, diskTotal: 2048 * 1048576 });
  expect(s.cpuUsedPct).toBeGreaterThan(37.5);
  expect(s.timestampUnix).toBe(Math.floor(Date.parse(s.timestamp) / 1000));
  // oldest first, each sample a later envd answer
  for (let i = 1; i < samples.length; i++) {
    expect(Date.parse(samples[i].timestamp)).toBeGreaterThanOrEqual(Date.parse(samples[i - 1].timestamp));
    expect(samples[i].cpuUsedPct).toBeGreaterThan(samples[i - 1].cpuUsedPct);
  }
  // [start, end] in unix seconds, inclusive
  const t0 = samples[0].timestampUnix;
  const inRange = (await json(await api(node, `/sandboxes/${metr1}/metrics?start=${t0}&end=${t0}`))).body as any[];
  expect(inRange.length).toBeGreaterThan(0);
  expect(inRange.every((m) => m.timestampUnix === t0)).toBe(true);
  expect((await json(await api(node, `/sandboxes/${metr1}/metrics?start=${t0 + 3600}`))).body).toEqual([]);

  const many = await json(await api(node, `/sandboxes/metrics?sandbox_ids=${metr1},nosuch0,${metr1}`));
  expect(many.status).toBe(200);
  expect(Object.keys(many.body.sandboxes)).toEqual([metr1]);
  expect(many.body.sandboxes[metr1].cpuCount).toBe(2);

  const prom = await (await api(node, "/metrics", { key: null })).text();
  expect(prom).toContain(`agentenv_sandbox_cpu_count{sandbox_id="${metr1}"} 2\n`);
  expect(prom).toContain(`agentenv_sandbox_memory_total_bytes{sandbox_id="${metr1}"} ${512 * 1048576}\n`);
  expect(prom).toContain(`agentenv_sandbox_disk_used_bytes{sandbox_id="${metr1}"} ${700 * 1048576}\n`);
  expect(prom).toMatch(new RegExp(`^agentenv_sandbox_cpu_used_percent\\{sandbox_id="${metr1}"\\} \\d+(\\.\\d+)?$`, "m"));

  // paused: no new samples, the history stays; killed: gone (404)
  await node.orch.pause(metr1);
  const callsOf = (token: string | null | undefined) => seenTokens.filter((t) => t === token).length;
  const calls = callsOf(rec.envdAccessToken);
  const kept = (await json(await api(node, `/sandboxes/${metr1}/metrics`))).body.length;
  // another running sandbox, read (so watched), sampled twice: the sampler has ticked since the pause
  const other = await createLoopback(node);
  expect((await api(node, `/sandboxes/${other.id}/metrics`)).status).toBe(200);
  await waitFor("two samples of another sandbox", () => callsOf(other.envdAccessToken) >= 2);
  await node.orch.kill(other.id);
  expect(callsOf(rec.envdAccessToken)).toBe(calls);
  expect((await json(await api(node, `/sandboxes/${metr1}/metrics`))).body.length).toBe(kept);
  expect(await (await api(node, "/metrics", { key: null })).text()).not.toContain(metr1);
  await node.orch.kill(metr1);
  const gone = await json(await api(node, `/sandboxes/${metr1}/metrics`));
  expect(gone.status).toBe(404);
  expect(gone.body).toMatchObject({ code: 404, message: `sandbox "${metr1}" doesn't exist or you don't have access to it` });
  expect((await json(await api(node, `/sandboxes/metrics?sandbox_ids=${metr1}`))).body).toEqual({ sandboxes: {} });
});

test("metrics on demand: nobody reads, nothing is sampled; a read answers with a sample taken for it; a scrape samples without watching", async () => {
  const watched = (await createLoopback(node)).id;
  const idle = (await createLoopback(node)).id;
  const scraped = (await createLoopback(node)).id;
  const count = (id: string) => node.orch.metricsHistory.range(id).length;
  // `watched` is read: sampled every 100 ms from then on; meanwhile nobody reads `idle`
  const first = (await json(await api(node, `/sandboxes/${watched}/metrics`))).body as any[];
  expect(first.length).toBe(1); // the read's own sample, taken before the answer
  await waitFor("4 samples of the watched sandbox", async () => (count(watched) >= 4 ? true : undefined));
  expect(count(idle)).toBe(0);
  // its first read answers at once with one sample, in the usual shape
  const got = (await json(await api(node, `/sandboxes/metrics?sandbox_ids=${idle}`))).body;
  expect(Object.keys(got.sandboxes)).toEqual([idle]);
  expect(Object.keys(got.sandboxes[idle]).sort()).toEqual(["cpuCount", "cpuUsedPct", "diskTotal", "diskUsed", "memCache", "memTotal", "memUsed", "timestamp", "timestampUnix"]);
  expect(count(idle)).toBe(1);
  // a Prometheus scrape: one current sample of each running sandbox, and no watching
  const prom = await (await api(node, "/metrics", { key: null })).text();
  expect(prom).toContain(`agentenv_sandbox_cpu_count{sandbox_id="${scraped}"} 2\n`);
  expect(count(scraped)).toBe(1);
  const seen = count(watched);
  await waitFor("4 more samples of the watched sandbox", async () => (count(watched) >= seen + 4 ? true : undefined));
  expect(count(scraped)).toBe(1);
  for (const id of [watched, idle, scraped]) await node.orch.kill(id);
});

test("metrics: bad input is a 400 with the E2B body", async () => {
  const metr2 = (await createLoopback(node)).id;
  const backwards = await json(await api(node, `/sandboxes/${metr2}/metrics?start=200&end=100`));
  expect(backwards.status).toBe(400);
  expect(backwards.body).toEqual({ code: 400, message: "end (100) must not be before start (200)", error_code: "api.bad_time_range" });
  expect((await api(node, `/sandboxes/${metr2}/metrics?start=yesterday`)).status).toBe(400);
  expect((await api(node, `/sandboxes/${metr2}/metrics?end=-5`)).status).toBe(400);
  const ids = Array.from({ length: 101 }, (_, i) => `s${i}`).join(",");
  const tooMany = await json(await api(node, `/sandboxes/metrics?sandbox_ids=${ids}`));
  expect(tooMany.status).toBe(400);
  expect(tooMany.body.message).toBe("sandbox_ids names 101 ids; at most 100 are allowed");
  expect((await api(node, "/sandboxes/metrics?sandbox_ids=,,")).status).toBe(400);
  expect((await api(node, "/sandboxes/metrics")).status).toBe(400);
  const unknown = await json(await api(node, "/sandboxes/nosuchbox/metrics"));
  expect(unknown.status).toBe(404);
  expect(unknown.body.code).toBe(404);
  await node.orch.kill(metr2);
});

test("logs: lifecycle, console and envd lines; cursor, direction, level, search, limit; v1 shape; bounded; kept while paused", async () => {
  const logs1 = (await createLoopback(node)).id;
  // what a VM's console would hand over through the runtime's sink (RuntimeStartSpec.onLog)
  const sink = (line: string, at: number) => node.orch.logs.append(logs1, { ...consoleLogLine(line, at), fields: consoleLogLine(line, at).fields ?? {} });
  const base = Date.now() + 1000;
  sink("[    0.000000] Linux version 6.1", base);
  sink('{"level":30,"time":1,"pid":7,"subsystem":"envd","port":49983,"msg":"envd listening"}', base + 1);
  sink('{"level":50,"time":1,"pid":7,"subsystem":"envd.process","pid2":12,"msg":"process start failed"}', base + 2);
  sink("hello from the guest console", base + 3);
  sink("y".repeat(100), base + 4); // longer than max_line_bytes (64): two entries

  const all = (await json(await api(node, `/v2/sandboxes/${logs1}/logs`))).body.logs as any[];
  expect(all[0]).toMatchObject({ level: "info", message: "sandbox create requested", fields: { source: "lifecycle", from: "", to: "creating" } });
  expect(all[1]).toMatchObject({ level: "info", message: "sandbox created", fields: { source: "lifecycle", from: "creating", to: "running" } });
  expect(all.slice(2).map((e) => [e.fields.source, e.level, e.message])).toEqual([
    ["console", "info", "[    0.000000] Linux version 6.1"],
    ["envd", "info", "envd listening"],
    ["envd", "error", "process start failed"],
    ["console", "info", "hello from the guest console"],
    ["console", "info", "y".repeat(64)],
    ["console", "info", "y".repeat(36)],
  ]);
  expect(all[3].fields).toMatchObject({ subsystem: "envd", port: "49983" });
  expect(all[3].timestamp).toBe(new Date(base + 1).toISOString());

  const q = async (qs: string) => ((await json(await api(node, `/v2/sandboxes/${logs1}/logs?${qs}`))).body.logs as any[]).map((e) => e.message);
  expect(await q(`cursor=${base + 2}&limit=2`)).toEqual(["process start failed", "hello from the guest console"]);
  expect(await q(`cursor=${base + 2}&direction=backward&limit=2`)).toEqual(["process start failed", "envd listening"]);
  expect(await q("direction=backward&limit=1")).toEqual(["y".repeat(36)]);
  expect(await q("level=warn")).toEqual(["process start failed"]);
  expect(await q("search=guest")).toEqual(["hello from the guest console"]);
  expect(await q("search=GUEST")).toEqual([]);
  expect(await q("limit=0")).toEqual([]);

  const v1 = (await json(await api(node, `/sandboxes/${logs1}/logs?start=${base + 3}&limit=1`))).body;
  expect(v1).toEqual({
    logs: [{ timestamp: new Date(base + 3).toISOString(), line: "hello from the guest console" }],
    logEntries: [{ timestamp: new Date(base + 3).toISOString(), level: "info", message: "hello from the guest console", fields: { source: "console" } }],
  });

  // kept while paused
  await node.orch.pause(logs1);
  expect((await q("search=hello")).length).toBe(1);

  // bounded: 50 entries per sandbox, the oldest go first
  for (let i = 0; i < 80; i++) sink(`line ${i}`, base + 10 + i);
  const kept = await q("limit=1000");
  expect(kept.length).toBe(50);
  expect(kept[0]).toBe("line 30");
  expect(kept[49]).toBe("line 79");

  await node.orch.kill(logs1);
  expect((await api(node, `/v2/sandboxes/${logs1}/logs`)).status).toBe(404);
});

test("logs: bad input is a 400, unknown sandbox a 404, both with the E2B body", async () => {
  const logs2 = (await createLoopback(node)).id;
  for (const qs of ["limit=1001", "direction=sideways", "level=fatal", "cursor=abc", `search=${"s".repeat(257)}`, "limit=-1"]) {
    const r = await json(await api(node, `/v2/sandboxes/${logs2}/logs?${qs}`));
    expect([qs, r.status, r.body.code]).toEqual([qs, 400, 400]);
  }
  for (const p of ["/v2/sandboxes/nosuchbox/logs", "/sandboxes/nosuchbox/logs"]) {
    const r = await json(await api(node, p));
    expect(r.status).toBe(404);
    expect(r.body).toMatchObject({ code: 404, error_code: "orchestrator.not_found" });
  }
  await node.orch.kill(logs2);
});

test("console line classification and UTF-8 safe splitting", () => {
  expect(consoleLogLine("plain text", 5)).toEqual({ at: 5, level: "info", source: "console", message: "plain text" });
  expect(consoleLogLine('{"level":40,"msg":"x","subsystem":"envd.watch","n":3,"err":{"a":1}}', 6)).toEqual({
    at: 6,
    level: "warn",
    source: "envd",
    message: "x",
    fields: { subsystem: "envd.watch", n: "3", err: '{"a":1}' },
  });
  // JSON that is not envd's (a program printing JSON) stays a console line
  expect(consoleLogLine('{"msg":"mine","level":50}', 7).source).toBe("console");
  expect(consoleLogLine("{not json", 8).source).toBe("console");
  expect(splitUtf8("abc", 3)).toEqual(["abc"]);
  expect(splitUtf8("ééé", 3)).toEqual(["é", "é", "é"]);
  expect(splitUtf8("aéb", 2)).toEqual(["a", "é", "b"]);
  expect(splitUtf8("", 4)).toEqual([""]);
});
