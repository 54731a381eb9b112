/**
 * Node API benchmark (real parts: API, orchestrator, SQLite, network slots, QEMU microVMs,
 * envd). Re-runs itself inside a private network namespace, boots a node in-process on
 * 127.0.0.1 with the test data dir's kernel and base template, and prints:
 *  1. the node's own overhead on create: client-observed create time minus the VM runtime's
 *     start (boot + envd ready + init), measured in the same run, as a ratio to the boot;
 *  2. create+kill throughput with 8 concurrent clients against 1 client (baseline, same run);
 *  3. API-only latencies (GET one sandbox, list) against GET /health (baseline, same run);
 *  4. the metrics routes with 20 sandboxes' full history ([metrics] history_samples each; the
 *     records are registered and their histories filled, no VMs): one sandbox's whole history,
 *     a one-minute window, and the latest sample of all 20, against GET /health;
 *  5. the volume attach cost on create: create (+ kill) with one volume mounted against without
 *     (baseline), alternating, as a ratio.
 *  6. a small proxied HTTP request (envd's GET /health through the node's sandbox proxy, routed
 *     by the SDK's headers) against the same request sent directly to the guest port (baseline,
 *     same sandbox, interleaved): the proxy's cost per request.
 * Usage: bun bench/api.ts [--cycles N]   (root; AENV_TEST_HOME_PATH, default /var/lib/agentenv-test;
 *   AENV__vm__boot_snapshots=false: cold boots boot the kernel, for the boot snapshots' gain)
 */
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, readdirSync } from "node:fs";
import { join } from "node:path";

const TEST_HOME = process.env.AENV_TEST_HOME_PATH ?? "/var/lib/agentenv-test";
const cyclesArg = process.argv.indexOf("--cycles");
const CYCLES = cyclesArg > 0 ? Number(process.argv[cyclesArg + 1]) : 3;

if (!process.env.AENV_BENCH_INNER) {
  const ns = `aeb${process.pid % 1000}`;
  const sh = (c: string[]) => Bun.spawnSync(c, { stdout: "inherit", stderr: "inherit" }).exitCode;
  if (sh(["ip", "netns", "add", ns]) !== 0) process.exit(1);
  let code = 1;
  try {
    sh(["ip", "-n", ns, "link", "set", "lo", "up"]);
    const p = Bun.spawn(["nsenter", `--net=/run/netns/${ns}`, "--", process.execPath, import.meta.path, ...process.argv.slice(2)], {
      stdout: "inherit",
      stderr: "inherit",
      env: { ...process.env, AENV_LOG_LEVEL: process.env.AENV_LOG_LEVEL ?? "warn", AENV_BENCH_INNER: ns },
    });
    code = await p.exited;
  } finally {
    for (const n of readdirSync("/run/netns")) if (n.startsWith(`${ns}-`)) sh(["ip", "netns", "del", n]);
    sh(["ip", "netns", "del", ns]);
  }
  process.exit(code);
}

const { loadConfig } = await import("../src/config/index.ts");
const { bootNode } = await import("../src/node/index.ts");
const { createVmRuntime } = await import("../src/sandbox/index.ts");
const { resolveKernelPath } = await import("../src/vmm/index.ts");
const { ENVD_PORT } = await import("../src/envd/version.ts");
const { LoopbackRuntime } = await import("../test/helpers/loopback-runtime.ts");
const { seedSnapshots } = await import("../test/e2e/world.ts");

const home = mkdtempSync("/tmp/aenv-bench-");
const memDir = mkdtempSync("/dev/shm/aenv-bench-");
mkdirSync(join(home, "run"));
for (const d of ["templates", "tools"]) symlinkSync(join(TEST_HOME, d), join(home, d));
// the base template's committed snapshot, as the e2e worlds do: without it every create cold-boots
seedSnapshots(join(TEST_HOME, "snapshots"), join(home, "snapshots"));
const cfg = loadConfig({
  env: {
    AENV_HOME_PATH: home,
    AENV_RUNTIME_PATH: join(home, "run"),
    AENV_API_ADDR: "127.0.0.1:0",
    AENV_LOG_LEVEL: "warn",
    AENV__kernel__path: resolveKernelPath(loadConfig({ env: { AENV_HOME_PATH: TEST_HOME } })),
    AENV__qemu__memory_dir: memDir,
    AENV__network__name_prefix: `${process.env.AENV_BENCH_INNER}-`,
    // this box has 2 cores: at most 2 VMs at once
    AENV__orchestrator__max_sandboxes: "2",
    AENV__orchestrator__max_concurrent_starts: "2",
    // AENV__vm__boot_snapshots=false measures cold boots (e.g. the volume create's gain)
    AENV__vm__boot_snapshots: process.env.AENV__vm__boot_snapshots ?? "true",
  },
});

const startMs = new Map<string, number>();
const node = await bootNode(cfg, async (c, db, oc) => {
  const rt = await createVmRuntime(c, db, oc);
  const start = rt.start.bind(rt);
  rt.start = async (spec) => {
    const t = performance.now();
    const r = await start(spec);
    startMs.set(spec.id, performance.now() - t);
    return r;
  };
  return rt;
});
const H = { "x-api-key": node.apiKey, "content-type": "application/json" };

async function create(extra: Record<string, unknown> = {}): Promise<{ id: string; ms: number }> {
  for (;;) {
    const t = performance.now();
    const r = await fetch(`${node.url}/v2/sandboxes`, { method: "POST", headers: H, body: JSON.stringify({ templateID: "base", timeout: 120, ...extra }) });
    if (r.status === 429) {
      await r.arrayBuffer();
      await Bun.sleep(50);
      continue;
    }
    const b = (await r.json()) as { sandboxID?: string; message?: string };
    if (r.status !== 201) throw new Error(`create: ${r.status} ${b.message}`);
    return { id: b.sandboxID!, ms: performance.now() - t };
  }
}
async function kill(id: string): Promise<void> {
  const r = await fetch(`${node.url}/sandboxes/${id}`, { method: "DELETE", headers: H });
  if (r.status !== 204) throw new Error(`kill ${id}: ${r.status}`);
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const f = (x: number) => x.toFixed(1);

try {
  // warm-up (page cache of the template, kernel)
  await kill((await create()).id);

  // 1. overhead on create
  const totals: number[] = [];
  const boots: number[] = [];
  for (let i = 0; i < CYCLES; i++) {
    const c = await create();
    totals.push(c.ms);
    boots.push(startMs.get(c.id)!);
    await kill(c.id);
  }
  const overhead = totals.map((t, i) => t - boots[i]!);
  console.log(`create: total median ${f(median(totals))} ms, VM start (boot+envd+init, baseline) median ${f(median(boots))} ms`);
  console.log(`create: node overhead median ${f(median(overhead))} ms = ${(median(overhead) / median(boots)).toFixed(5)}x of the VM start`);

  // 2. throughput, 1 client (baseline) then 8 concurrent clients
  const run = async (clients: number, total: number) => {
    let left = total;
    const t = performance.now();
    await Promise.all(
      Array.from({ length: clients }, async () => {
        while (left > 0) {
          left--;
          await kill((await create()).id);
        }
      }),
    );
    return (total / (performance.now() - t)) * 1000;
  };
  const one = await run(1, CYCLES);
  const eight = await run(8, CYCLES * 2);
  console.log(`create+kill throughput: 1 client ${one.toFixed(2)}/s (baseline), 8 clients ${eight.toFixed(2)}/s = ${(eight / one).toFixed(2)}x`);

  // 3. API-only latency on a live sandbox
  const live = await create();
  const lat = async (path: string, n = 300) => {
    const xs: number[] = [];
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      await (await fetch(node.url + path, { headers: H })).arrayBuffer();
      xs.push(performance.now() - t);
    }
    return median(xs) * 1000;
  };
  const health = await lat("/health");
  const getOne = await lat(`/sandboxes/${live.id}`);
  const list = await lat("/v2/sandboxes");
  console.log(`API latency (median, µs): /health ${f(health)} (baseline), GET /sandboxes/{id} ${f(getOne)} = ${(getOne / health).toFixed(2)}x, GET /v2/sandboxes ${f(list)} = ${(list / health).toFixed(2)}x`);

  // 6. proxied vs direct small request to the guest's envd, interleaved (on the live sandbox of 3)
  const directUrl = `http://${node.orch.get(live.id).endpoint!.host}:${ENVD_PORT}/health`;
  const proxied = { "e2b-sandbox-id": live.id, "e2b-sandbox-port": String(ENVD_PORT) };
  const once = async (url: string, headers: Record<string, string>) => {
    const t = performance.now();
    const r = await fetch(url, { headers });
    await r.arrayBuffer();
    if (r.status !== 204 && r.status !== 200) throw new Error(`${url}: ${r.status}`);
    return (performance.now() - t) * 1000;
  };
  const direct: number[] = [];
  const viaProxy: number[] = [];
  for (let i = 0; i < 20; i++) await once(directUrl, {}), await once(`${node.url}/health`, proxied); // warm both paths
  for (let i = 0; i < 300; i++) {
    direct.push(await once(directUrl, {}));
    viaProxy.push(await once(`${node.url}/health`, proxied));
  }
  console.log(`proxy latency (median, µs): direct to guest :${ENVD_PORT} ${f(median(direct))} (baseline), through the node's proxy ${f(median(viaProxy))} = ${(median(viaProxy) / median(direct)).toFixed(2)}x`);
  await kill(live.id);

  // 4. metrics routes with 20 sandboxes' full history. This box runs at most 2 VMs: the 20 are
  // loopback guests of a second node (same code, no VMs), created through its orchestrator.
  const hist = cfg.metrics.history_samples;
  const stepMs = cfg.metrics.sample_interval_ms;
  const ids: string[] = [];
  const now = Date.now();
  const home2 = mkdtempSync("/tmp/aenv-bench-metrics-");
  const node2 = await bootNode(
    loadConfig({
      env: {
        AENV_HOME_PATH: home2,
        AENV_RUNTIME_PATH: join(home2, "run"),
        AENV_API_ADDR: "127.0.0.1:0",
        AENV_LOG_LEVEL: "warn",
        AENV__network__name_prefix: `${process.env.AENV_BENCH_INNER}m-`,
        AENV__orchestrator__max_sandboxes: "20",
      },
    }),
    async () => new LoopbackRuntime(),
  );
  for (let i = 0; i < 20; i++) {
    const id = (await node2.orch.create({ template: "base", secure: true, timeoutSecs: 3600 })).id;
    for (let k = hist; k > 0; k--) {
      node2.orch.metricsHistory.add(id, { at: now - k * stepMs, cpuCount: 1, cpuUsedPct: (k * 7) % 100, memUsed: 100e6 + k, memTotal: 500e6, memCache: 20e6, diskUsed: 700e6, diskTotal: 2e9 });
    }
    ids.push(id);
  }
  const lat2 = async (path: string, n: number) => {
    const xs: number[] = [];
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      await (await fetch(node2.url + path, { headers: { "x-api-key": node2.apiKey } })).arrayBuffer();
      xs.push(performance.now() - t);
    }
    return median(xs) * 1000;
  };
  const oneFull = await lat2(`/sandboxes/${ids[7]}/metrics`, 200);
  const minute = Math.floor(now / 1000);
  const window = await lat2(`/sandboxes/${ids[7]}/metrics?start=${minute - 60}&end=${minute}`, 200);
  const all20 = await lat2(`/sandboxes/metrics?sandbox_ids=${ids.join(",")}`, 200);
  console.log(
    `metrics routes, 20 sandboxes x ${hist} samples (median, µs): /health ${f(health)} (baseline), one sandbox's whole history ${f(oneFull)} = ${(oneFull / health).toFixed(2)}x, a 60 s window ${f(window)} = ${(window / health).toFixed(2)}x, latest of 20 ${f(all20)} = ${(all20 / health).toFixed(2)}x`,
  );
  await node2.close();
  rmSync(home2, { recursive: true, force: true });

  // 5. volume attach cost on create (create + kill, alternating with and without a volume). A
  // create without volumes restores the template's snapshot (or takes a pooled VM); one with a
  // volume restores the boot snapshot with one volume slot (made by an untimed first such
  // create), mounts the sandbox's root disk, re-probes the volume's drive and mounts the volume
  // (AENV__vm__boot_snapshots=false: boots the kernel instead)

  const vr = await fetch(`${node.url}/volumes`, { method: "POST", headers: H, body: JSON.stringify({ name: "bench-vol" }) });
  const vol = (await vr.json()) as { volumeID: string };
  if (vr.status !== 201) throw new Error(`volume create: ${vr.status} ${JSON.stringify(vol)}`);
  const plain: number[] = [];
  const withVol: number[] = [];
  await kill((await create({ volumeMounts: [{ name: "bench-vol", path: "/mnt/bench" }] })).id);
  for (let i = 0; i < CYCLES; i++) {
    const a = await create();
    plain.push(a.ms);
    await kill(a.id);
    const b = await create({ volumeMounts: [{ name: "bench-vol", path: "/mnt/bench" }] });
    withVol.push(b.ms);
    await kill(b.id);
  }
  console.log(`create with one volume mounted: median ${f(median(withVol))} ms vs without ${f(median(plain))} ms (baseline) = ${(median(withVol) / median(plain)).toFixed(3)}x`);
  const del = await fetch(`${node.url}/volumes/${vol.volumeID}`, { method: "DELETE", headers: H });
  if (del.status !== 204) throw new Error(`volume delete: ${del.status}`);
} finally {
  await node.close();
  rmSync(home, { recursive: true, force: true });
  rmSync(memDir, { recursive: true, force: true });
}
