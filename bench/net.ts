/**
 * Network slot bench (root): slot allocate time from the warm pool vs built on demand (median of
 * 50 each, same run), and the pool worker's refill rate. Runs the NetworkManager inside a netns it
 * makes (re-executing itself under nsenter), with link-local test ranges; removes everything after.
 *   bun bench/net.ts [N=50]
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { defaultConfig } from "../src/config/index.ts";
import { openDb } from "../src/db/index.ts";
import { defaultPolicy, type NetConfig, netConfigFromConfig, NetworkManager, parseEgressPolicy } from "../src/net/index.ts";

const N = Number(process.argv[2] ?? 50);
const NODE_NS = "aenvbench-node";

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

function config(low: number, high: number, maintenance: boolean): NetConfig {
  const t = defaultConfig() as any;
  t.network.name_prefix = "abench-";
  t.network.max_slots = 2 * N + 8;
  t.network.internal.host_interaction_cidr = "169.254.64.0/20";
  t.network.internal.veth_cidr = "169.254.128.0/20";
  t.network.egress.default_action = "deny";
  // as in production (DNS redirect rules in every slot); no query is ever sent
  t.network.egress.dns_proxy_enabled = true;
  t.network.egress.dns_upstream = ["127.0.0.1:53"];
  // slots only: the egress interceptor (its CA in a data dir) is measured by bench/egress.ts
  t.network.egress.interceptor_enabled = false;
  t.pool.low_watermark = low;
  t.pool.high_watermark = high;
  t.pool.network.maintenance_enabled = maintenance;
  return netConfigFromConfig(t);
}

async function inner(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "net-bench-"));
  try {
    // 1. on demand: empty pool, no worker
    let db = openDb(join(dir, "a.db"));
    let net = new NetworkManager(config(0, 0, false), db);
    await net.start();
    const onDemand: number[] = [];
    for (let i = 0; i < N; i++) {
      const t0 = performance.now();
      await net.allocate(defaultPolicy(), `d${i}`);
      onDemand.push(performance.now() - t0);
    }
    const r0 = performance.now();
    for (let i = 0; i < N; i++) await net.release(`d${i}`);
    const releaseDestroyMs = (performance.now() - r0) / N;
    await net.shutdown();
    db.close();

    // 2. warm pool of N: refill rate at start, then N allocations that all hit the pool
    db = openDb(join(dir, "b.db"));
    net = new NetworkManager(config(N, N, false), db);
    const f0 = performance.now();
    await net.start();
    const fillMs = performance.now() - f0;
    const warm: number[] = [];
    for (let i = 0; i < N; i++) {
      const t0 = performance.now();
      await net.allocate(defaultPolicy(), `w${i}`);
      warm.push(performance.now() - t0);
    }
    const r1 = performance.now();
    for (let i = 0; i < N; i++) await net.release(`w${i}`);
    const releaseResetMs = (performance.now() - r1) / N;
    // the same warm slots again, now with a non-default policy (one iptables-restore each)
    const custom = parseEgressPolicy({ allowOut: ["169.254.200.0/24", "*.example.com"], denyOut: ["8.8.8.8"] });
    const warmCustom: number[] = [];
    for (let i = 0; i < N; i++) {
      const t0 = performance.now();
      await net.allocate(custom, `c${i}`);
      warmCustom.push(performance.now() - t0);
    }
    if (net.stats().poolHits !== 2 * N) throw new Error(`expected ${2 * N} pool hits, got ${net.stats().poolHits}`);
    await net.shutdown();
    db.close();

    const mOn = median(onDemand);
    const mWarm = median(warm);
    console.log(`slots: ${N}; all times ms, medians of ${N}`);
    console.log(`allocate on demand (build netns+veth+tap+rules, 2 process spawns): ${mOn.toFixed(2)}`);
    const mCustom = median(warmCustom);
    console.log(`allocate from warm pool, default policy (no kernel call): ${mWarm.toFixed(2)}`);
    console.log(`allocate from warm pool, custom policy (1 iptables-restore): ${mCustom.toFixed(2)}`);
    console.log(`ratio on-demand / warm default: ${(mOn / mWarm).toFixed(1)}x; on-demand / warm custom: ${(mOn / mCustom).toFixed(1)}x`);
    console.log(`pool refill: ${N} slots in ${fillMs.toFixed(0)} ms = ${((N * 1000) / fillMs).toFixed(1)} slots/s`);
    console.log(`release: reset to pool ${releaseResetMs.toFixed(2)} per slot, destroy ${releaseDestroyMs.toFixed(2)} per slot`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.env.AENV_BENCH_INNER) {
  await inner();
} else {
  if (process.getuid?.() !== 0) throw new Error("bench/net.ts needs root (netns, iptables)");
  Bun.spawnSync(["ip", "netns", "del", NODE_NS]);
  Bun.spawnSync(["ip", "netns", "add", NODE_NS]);
  try {
    const p = Bun.spawn(["nsenter", `--net=/run/netns/${NODE_NS}`, process.execPath, import.meta.path, String(N)], {
      env: { ...process.env, AENV_BENCH_INNER: "1", AENV_LOG_LEVEL: "error" },
      stdout: "inherit",
      stderr: "inherit",
    });
    process.exitCode = await p.exited;
  } finally {
    for (const ns of new Bun.Glob("abench-*").scanSync("/run/netns")) Bun.spawnSync(["ip", "netns", "del", ns]);
    Bun.spawnSync(["ip", "netns", "del", NODE_NS]);
  }
}
