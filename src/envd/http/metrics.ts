/**
 * `GET /metrics` body (envd.yaml `Metrics`): CPU from /proc/stat deltas between calls, memory
 * from /proc/meminfo, disk from statfs("/"). Units: bytes, MiB where the name says so, unix s.
 */
import { readFileSync, statfsSync } from "node:fs";
import { cpus } from "node:os";
import type { CpuMeter } from "../../ffi/cpu.ts";

/** Wire shape of /metrics. */
export interface EnvdMetrics {
  ts: number;
  cpu_count: number;
  cpu_used_pct: number;
  mem_total: number;
  mem_used: number;
  mem_cache: number;
  mem_total_mib: number;
  mem_used_mib: number;
  disk_used: number;
  disk_total: number;
}


/** Parse /proc/meminfo into bytes per key. */
export function parseMeminfo(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split("\n")) {
    const m = /^(\w+):\s+(\d+)(?:\s+kB)?/.exec(line);
    if (m) out[m[1]!] = Number(m[2]) * (line.endsWith("kB") ? 1024 : 1);
  }
  return out;
}

/** Collect one metrics sample. CPU % is over the time since `cpu`'s previous call (0 on the first). */
export function collectMetrics(cpu: CpuMeter): EnvdMetrics {
  const pct = cpu.sinceLast();
  const mem = parseMeminfo(readFileSync("/proc/meminfo", "utf8"));
  const total = mem.MemTotal ?? 0;
  const used = total - (mem.MemAvailable ?? 0);
  const fs = statfsSync("/");
  return {
    ts: Math.floor(Date.now() / 1000),
    cpu_count: cpus().length,
    cpu_used_pct: Math.round(pct * 100) / 100,
    mem_total: total,
    mem_used: used,
    mem_cache: (mem.Cached ?? 0) + (mem.Buffers ?? 0),
    mem_total_mib: Math.floor(total / 1048576),
    mem_used_mib: Math.floor(used / 1048576),
    disk_used: (fs.blocks - fs.bfree) * fs.bsize,
    disk_total: fs.blocks * fs.bsize,
  };
}
