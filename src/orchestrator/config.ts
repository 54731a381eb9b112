/**
 * Typed view of the `[orchestrator]` config section (documented in config/default.toml).
 */
import { get, type ConfigTable } from "../config/index.ts";
import { OrchestratorError } from "./errors.ts";

export interface OrchestratorConfig {
  /** Sandbox lifetime when a create omits `timeout`, seconds. */
  defaultTimeoutSecs: number;
  /** Largest accepted `timeout`, seconds. */
  maxTimeoutSecs: number;
  /** Bound on live (creating + running + resuming) sandboxes; more creates answer 429. */
  maxSandboxes: number;
  /** Bound on sandboxes booting or resuming at once; more wait their turn. */
  maxConcurrentStarts: number;
  /** Bound on one create (boot + envd ready + init), ms. */
  createTimeoutMs: number;
  /** Bound on one pause (snapshot), ms. */
  pauseTimeoutMs: number;
  /** Bound on waiting for another operation on the same sandbox, ms. */
  lockWaitMs: number;
  /** Bound on operations queued on one sandbox. */
  lockMaxWaiters: number;
  /** Period of the expiry scan, ms. */
  evictIntervalMs: number;
  /** How long killed/failed rows stay in the database, seconds. */
  killedRetentionSecs: number;
  /** What a graceful shutdown does with running sandboxes. */
  shutdownAction: "kill" | "pause";
  /** vCPUs of a sandbox whose template does not say. */
  defaultCpuCount: number;
  /** Memory of a sandbox whose template does not say, MiB. */
  defaultMemoryMB: number;
  /** Largest vCPU count of one sandbox (template or request). */
  maxCpuCount: number;
  /** Largest memory of one sandbox, MiB (template or request). */
  maxMemoryMB: number;
  /** Period of polling envd's /health during boot, ms. */
  envdPollMs: number;
  /** `[metrics]`: sampling period, per-sample bound (ms) and samples kept per sandbox. */
  metrics: { sampleIntervalMs: number; sampleTimeoutMs: number; historySamples: number };
  /** `[logs]`: entries kept per sandbox, longest message (bytes), batch period (ms), pending bound. */
  logs: { maxEntriesPerSandbox: number; maxLineBytes: number; flushIntervalMs: number; maxPendingLines: number };
}

/** Read `[orchestrator]`. @throws OrchestratorError `orchestrator.bad_config` for out-of-range values. */
export function orchestratorConfig(cfg: ConfigTable): OrchestratorConfig {
  const n = (k: string, min: number) => {
    const key = k.includes(".") ? k : `orchestrator.${k}`;
    const v = get<number>(cfg, key);
    if (!Number.isInteger(v) || v < min) {
      throw new OrchestratorError("orchestrator.bad_config", 500, `${key} must be an integer >= ${min}, got ${v}`, { key: k, value: v });
    }
    return v;
  };
  const shutdownAction = get<string>(cfg, "orchestrator.shutdown_action");
  if (shutdownAction !== "kill" && shutdownAction !== "pause") {
    throw new OrchestratorError("orchestrator.bad_config", 500, `orchestrator.shutdown_action must be "kill" or "pause", got ${shutdownAction}`, { key: "shutdown_action", value: shutdownAction });
  }
  return {
    defaultTimeoutSecs: n("default_timeout_secs", 1),
    maxTimeoutSecs: n("max_timeout_secs", 1),
    maxSandboxes: n("max_sandboxes", 1),
    maxConcurrentStarts: n("max_concurrent_starts", 1),
    createTimeoutMs: n("create_timeout_ms", 100),
    pauseTimeoutMs: n("pause_timeout_ms", 100),
    lockWaitMs: n("lock_wait_ms", 1),
    lockMaxWaiters: n("lock_max_waiters", 1),
    evictIntervalMs: n("evict_interval_ms", 10),
    killedRetentionSecs: n("killed_retention_secs", 0),
    shutdownAction,
    defaultCpuCount: n("default_cpu_count", 1),
    defaultMemoryMB: n("default_memory_mb", 128),
    maxCpuCount: n("max_cpu_count", 1),
    maxMemoryMB: n("max_memory_mb", 128),
    envdPollMs: n("envd_poll_ms", 1),
    metrics: {
      sampleIntervalMs: n("metrics.sample_interval_ms", 100),
      sampleTimeoutMs: n("metrics.sample_timeout_ms", 10),
      historySamples: n("metrics.history_samples", 1),
    },
    logs: {
      maxEntriesPerSandbox: n("logs.max_entries_per_sandbox", 1),
      maxLineBytes: n("logs.max_line_bytes", 64),
      flushIntervalMs: n("logs.flush_interval_ms", 1),
      maxPendingLines: n("logs.max_pending_lines", 1),
    },
  };
}
