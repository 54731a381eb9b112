/**
 * Cluster benchmark (real scheduler, gateway and nodes on loopback; sandboxes are
 * LoopbackRuntime servers, so the figures are the control plane's own costs, not VM boots):
 *  1. gateway overhead per request: the same request proxied through the gateway vs sent
 *     directly to the node (ratio, same run), for sandbox traffic and for GET /sandboxes/{id};
 *  2. Schedule RPC latency p50/p99 with 1,000 bindings and 10 reporting nodes (round_robin and
 *     least_loaded), over gRPC on loopback;
 *  3. create throughput through the gateway (Schedule + node create + RecordAssignment) vs
 *     creates sent directly to the nodes, 8 concurrent clients.
 * Usage: bun bench/cluster.ts [--requests N] [--creates N]
 */
import "./quiet-logs.ts";
import { mkdtempSync, rmSync } from "node:fs";
import { loadConfig } from "../src/config/index.ts";
import { gatewayConfig, startGateway } from "../services/gateway/index.ts";
import { beat, freePort, startLoopbackNode, startTestScheduler } from "../test/services/helpers.ts";

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const REQUESTS = arg("--requests", 2000);
const CREATES = arg("--creates", 200);
const KEY = "e2b_" + "cd".repeat(20);

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
}
const us = (ms: number) => `${(ms * 1000).toFixed(0)} µs`;

async function timeEach(n: number, f: () => Promise<unknown>): Promise<number[]> {
  for (let i = 0; i < Math.min(200, n / 5); i++) await f(); // warm-up
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await f();
    out.push(performance.now() - t);
  }
  return out;
}

async function throughput(total: number, concurrency: number, f: () => Promise<void>): Promise<number> {
  let left = total;
  const t = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (left-- > 0) await f();
    }),
  );
  return total / ((performance.now() - t) / 1000);
}

const home = mkdtempSync("/tmp/aenv-bench-cluster-");
const schedPort = freePort();
const nodes = [await startLoopbackNode("a", schedPort, KEY, { AENV__orchestrator__max_sandboxes: "10000" }), await startLoopbackNode("b", schedPort, KEY, { AENV__orchestrator__max_sandboxes: "10000" })];
const sched = await startTestScheduler({ AENV_HOME_PATH: home, AENV__scheduler__addr: `127.0.0.1:${schedPort}`, AENV__scheduler__nodes: `a=${nodes[0]!.url},b=${nodes[1]!.url}` });
const gw = startGateway(gatewayConfig(loadConfig({ env: { AENV_HOME_PATH: home, AENV_API_KEY: KEY, AENV__gateway__addr: "127.0.0.1:0", AENV__cluster__scheduler_endpoint: `127.0.0.1:${schedPort}` } })));
const load = (await Bun.file("/proc/loadavg").text()).split(" ").slice(0, 3).join(" ");
console.log(`cluster bench: load average ${load}, ${REQUESTS} requests, ${CREATES} creates`);

try {
  // 1. gateway overhead
  const created = await fetch(`${gw.url}/v2/sandboxes`, { method: "POST", headers: { "x-api-key": KEY, "content-type": "application/json" }, body: JSON.stringify({ templateID: "base" }) });
  const id = ((await created.json()) as { sandboxID: string }).sandboxID;
  const home0 = (await sched.client.lookupNode({ sandboxId: id })).node!;
  const nodeUrl = home0.endpoint;
  const data = { "e2b-sandbox-id": id, "e2b-sandbox-port": "8080" };
  const directData = await timeEach(REQUESTS, async () => (await fetch(`${nodeUrl}/whoami`, { headers: data })).arrayBuffer());
  const viaData = await timeEach(REQUESTS, async () => (await fetch(`${gw.url}/whoami`, { headers: data })).arrayBuffer());
  const directCtl = await timeEach(REQUESTS, async () => (await fetch(`${nodeUrl}/sandboxes/${id}`, { headers: { "x-api-key": KEY } })).arrayBuffer());
  const viaCtl = await timeEach(REQUESTS, async () => (await fetch(`${gw.url}/sandboxes/${id}`, { headers: { "x-api-key": KEY } })).arrayBuffer());
  console.log("1. gateway overhead per request (median / p99; ratio of medians, proxied / direct):");
  console.log(`   sandbox traffic GET /whoami: direct ${us(pct(directData, 50))} / ${us(pct(directData, 99))}, via gateway ${us(pct(viaData, 50))} / ${us(pct(viaData, 99))}, ratio ${(pct(viaData, 50) / pct(directData, 50)).toFixed(2)}`);
  console.log(`   GET /sandboxes/{id}:         direct ${us(pct(directCtl, 50))} / ${us(pct(directCtl, 99))}, via gateway ${us(pct(viaCtl, 50))} / ${us(pct(viaCtl, 99))}, ratio ${(pct(viaCtl, 50) / pct(directCtl, 50)).toFixed(2)}`);

  // 2. Schedule latency with 1,000 bindings and 10 reported nodes (a separate scheduler)
  for (const strategy of ["round_robin", "least_loaded"]) {
    const ten = Array.from({ length: 10 }, (_, i) => `n${i}=http://127.0.0.1:${20000 + i}`).join(",");
    const s2 = await startTestScheduler({ AENV_HOME_PATH: mkdtempSync(`${home}/s2-`), AENV__scheduler__nodes: ten, AENV__scheduler__strategy: strategy });
    for (let i = 0; i < 10; i++) await s2.client.heartbeat(beat(`n${i}`, Array.from({ length: 100 }, (_, j) => `b${i}x${j}`)));
    const bound = await s2.core.store.countBindings();
    const sched = await timeEach(REQUESTS, () => s2.client.schedule({ hint: { newSandbox: { metadata: {} } } }));
    const look = await timeEach(REQUESTS, () => s2.client.lookupNode({ sandboxId: "b3x42" }));
    console.log(`2. Schedule (${strategy}, ${bound} bindings, 10 reported nodes): p50 ${us(pct(sched, 50))}, p99 ${us(pct(sched, 99))}; LookupNode p50 ${us(pct(look, 50))}, p99 ${us(pct(look, 99))}`);
    await s2.close();
  }

  // 3. create throughput
  const body = JSON.stringify({ templateID: "base", timeout: 3600 });
  const headers = { "x-api-key": KEY, "content-type": "application/json" };
  let turn = 0;
  const direct = await throughput(CREATES, 8, async () => {
    const r = await fetch(`${nodes[turn++ % 2]!.url}/v2/sandboxes`, { method: "POST", headers, body });
    if (r.status !== 201) throw new Error(`direct create: ${r.status} ${await r.text()}`);
  });
  const via = await throughput(CREATES, 8, async () => {
    const r = await fetch(`${gw.url}/v2/sandboxes`, { method: "POST", headers, body });
    if (r.status !== 201) throw new Error(`gateway create: ${r.status} ${await r.text()}`);
  });
  console.log(`3. create throughput, 8 clients: direct to nodes ${direct.toFixed(0)}/s, through the gateway ${via.toFixed(0)}/s (ratio ${(via / direct).toFixed(2)}); bindings now ${await sched.core.store.countBindings()}`);
} finally {
  await gw.close();
  await sched.close();
  for (const n of nodes) await n.dispose();
  rmSync(home, { recursive: true, force: true });
}
