/**
 * CPU usage of the machine this process runs on (the host; the guest for envd) from /proc/stat
 * (proc(5): the first line holds cumulative jiffies per state: user nice system idle iowait irq
 * softirq steal ...). Usage between two samples is 1 - Δ(idle + iowait) / Δtotal.
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

/**
 * Host CPU usage between the calls of one consumer: each consumer (the API's GET /nodes, the
 * scheduler reporter, envd's /metrics) owns its meter, so their windows do not cut each other.
 */
export class CpuMeter {
  private last: CpuSample | undefined;

  /** @param sample the sampler (default: /proc/stat), replaceable for tests. */
  constructor(private readonly sample: () => CpuSample = () => readCpuSample()) {}

  /**
   * Percent since this meter's previous call, rounded to a whole percent (the E2B/upstream
   * `cpuPercent` is an integer). The first call samples twice, `firstWindowMs` apart, so it
   * never reports a made-up zero.
   */
  async percent(firstWindowMs = 100): Promise<number> {
    let prev = this.last;
    if (!prev) {
      prev = this.sample();
      await Bun.sleep(firstWindowMs);
    }
    return Math.round(this.advance(prev));
  }

  /** Percent since the previous call without waiting (0 on the first call), unrounded. */
  sinceLast(): number {
    const prev = this.last;
    const pct = this.advance(prev);
    return prev ? pct : 0;
  }

  private advance(prev: CpuSample | undefined): number {
    const now = this.sample();
    this.last = now;
    return prev ? cpuPercentBetween(prev, now) : 0;
  }
}
