/**
 * Prometheus text exposition (format 0.0.4) of the orchestrator's counters,
 * reading the orchestrator's published counters. Served by the API at GET /metrics.
 */
import type { OrchestratorCounters, SandboxMetricsSample } from "../orchestrator/index.ts";

/** Metric name, type and help of each counter. */
const METRICS: [keyof OrchestratorCounters, string, "gauge" | "counter", string][] = [
  ["running", "agentenv_sandboxes_running", "gauge", "Sandboxes running (including pausing)."],
  ["paused", "agentenv_sandboxes_paused", "gauge", "Sandboxes paused (snapshot on disk)."],
  ["starting", "agentenv_sandboxes_starting", "gauge", "Sandboxes booting or resuming."],
  ["created", "agentenv_sandbox_creates_total", "counter", "Sandboxes created successfully since start."],
  ["failed", "agentenv_sandbox_create_failures_total", "counter", "Sandbox creates that failed since start."],
  ["killed", "agentenv_sandbox_kills_total", "counter", "Sandboxes killed since start."],
];

/** An extra gauge: its value, or value + HELP text. */
export type ExtraGauge = number | { value: number; help: string };

/** Render counters (and extra gauges) as Prometheus text. */
export function renderPrometheus(c: OrchestratorCounters, extra: Record<string, ExtraGauge> = {}): string {
  const lines: string[] = [];
  for (const [key, name, type, help] of METRICS) {
    lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`, `${name} ${c[key]}`);
  }
  for (const [name, g] of Object.entries(extra)) {
    if (typeof g === "number") lines.push(`# TYPE ${name} gauge`, `${name} ${g}`);
    else lines.push(`# HELP ${name} ${g.help}`, `# TYPE ${name} gauge`, `${name} ${g.value}`);
  }
  return lines.join("\n") + "\n";
}

/** Per-sandbox gauges: name, sample field, HELP. */
const SANDBOX_GAUGES: [string, keyof SandboxMetricsSample, string][] = [
  ["agentenv_sandbox_cpu_count", "cpuCount", "vCPUs of the sandbox."],
  ["agentenv_sandbox_cpu_used_percent", "cpuUsedPct", "CPU busy share of the sandbox's vCPUs at the last sample, 0..100."],
  ["agentenv_sandbox_memory_used_bytes", "memUsed", "Guest memory in use (MemTotal - MemAvailable) at the last sample."],
  ["agentenv_sandbox_memory_total_bytes", "memTotal", "Guest memory size (MemTotal)."],
  ["agentenv_sandbox_memory_cache_bytes", "memCache", "Guest page cache and buffers at the last sample."],
  ["agentenv_sandbox_disk_used_bytes", "diskUsed", "Used bytes of the sandbox's root filesystem at the last sample."],
  ["agentenv_sandbox_disk_total_bytes", "diskTotal", "Size of the sandbox's root filesystem."],
];

/**
 * Prometheus text of the last sample of each running sandbox, one series per sandbox per gauge
 * with the single label `sandbox_id` (bounded by the node's sandbox limit; no per-request labels).
 * Sandbox ids match ^[a-z0-9]+$, so they need no escaping.
 */
export function renderSandboxMetrics(latest: ReadonlyMap<string, SandboxMetricsSample>): string {
  if (latest.size === 0) return "";
  const lines: string[] = [];
  for (const [name, key, help] of SANDBOX_GAUGES) {
    lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`);
    for (const [id, s] of latest) lines.push(`${name}{sandbox_id="${id}"} ${s[key]}`);
  }
  return lines.join("\n") + "\n";
}
