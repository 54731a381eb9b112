/**
 * Host CPU usage from /proc/stat (proc(5): the first line holds cumulative jiffies per state:
 * user nice system idle iowait irq softirq steal ...). Usage between two samples is
 * 1 - Δ(idle + iowait) / Δtotal.
 */
import { readFileSync } from "node:fs";

/** Cumulative CPU jiffies: busy and total. */
export interface CpuSample {
  busy: number;
  total: number;
}

/** Read the aggregate `cpu` line of /proc/stat. @throws when /proc is not mounted. */
export function readCpuSample(stat = readFileSync("/proc/stat", "utf8")): CpuSample {
  const line = stat.split("\n", 1)[0]!;
  const f = line.trim().split(/\s+/).slice(1).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  const idle = (f[3] ?? 0) + (f[4] ?? 0);
  return { busy: total - idle, total };
}

/** Percent (0–100) of CPU time busy between two samples; 0 when no time passed. */
export function cpuPercentBetween(a: CpuSample, b: CpuSample): number {
  const dt = b.total - a.total;
  return dt > 0 ? Math.min(100, Math.max(0, ((b.busy - a.busy) / dt) * 100)) : 0;
}

let last: CpuSample | undefined;

/**
 * Host CPU percent since the previous call, rounded to a whole percent (the E2B/upstream
 * `cpuPercent` is an integer). The first call samples twice, `firstWindowMs`
 * apart, so it never reports a made-up zero.
 */
export async function hostCpuPercent(firstWindowMs = 100): Promise<number> {
  let prev = last;
  if (!prev) {
    prev = readCpuSample();
    await Bun.sleep(firstWindowMs);
  }
  const now = readCpuSample();
  last = now;
  return Math.round(cpuPercentBetween(prev, now));
}
