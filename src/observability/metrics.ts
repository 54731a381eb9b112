/**
 * Prometheus text exposition (format 0.0.4) of the orchestrator's counters,
 * reading the orchestrator's published counters. Served by the API at GET /metrics.
 */
import type { OrchestratorCounters } from "../orchestrator/types.ts";

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
