/**
 * Typed view of the `[orchestrator]` config section (documented in config/default.toml).
 */
import type { Config } from "../config/index.ts";

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
  /** How long killed/failed rows stay in the database, seconds. */
  killedRetentionSecs: number;
  /** What a graceful shutdown does with running sandboxes (detach: leave them running for the next node). */
  shutdownAction: "kill" | "pause" | "detach";
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
  /**
   * `[metrics]`: sampling period of watched sandboxes, how long a read keeps one watched, period
   * of the others (0: none), per-sample bound (ms), samples in flight and kept per sandbox.
   */
  metrics: { sampleIntervalMs: number; watchMs: number; idleSampleIntervalMs: number; sampleTimeoutMs: number; maxConcurrentSamples: number; historySamples: number };
  /** `[volumes]` the orchestrator needs: new volume size (bytes), mounts per sandbox, guest detach bound (ms). */
  volumes: { sizeBytes: number; maxMountsPerSandbox: number; detachTimeoutMs: number };
  /** `[logs]`: entries kept per sandbox, longest message (bytes), batch period (ms), pending bound. */
  logs: { maxEntriesPerSandbox: number; maxLineBytes: number; flushIntervalMs: number; maxPendingLines: number };
}

/** Read `[orchestrator]`, `[metrics]`, `[volumes]` and `[logs]` (ranges were checked when the config was loaded). */
export function orchestratorConfig(cfg: Config): OrchestratorConfig {
  const o = cfg.orchestrator;
  return {
    defaultTimeoutSecs: o.default_timeout_secs,
    maxTimeoutSecs: o.max_timeout_secs,
    maxSandboxes: o.max_sandboxes,
    maxConcurrentStarts: o.max_concurrent_starts,
    createTimeoutMs: o.create_timeout_ms,
    pauseTimeoutMs: o.pause_timeout_ms,
    lockWaitMs: o.lock_wait_ms,
    lockMaxWaiters: o.lock_max_waiters,
    killedRetentionSecs: o.killed_retention_secs,
    shutdownAction: o.shutdown_action,
    defaultCpuCount: o.default_cpu_count,
    defaultMemoryMB: o.default_memory_mb,
    maxCpuCount: o.max_cpu_count,
    maxMemoryMB: o.max_memory_mb,
    envdPollMs: o.envd_poll_ms,
    metrics: {
      sampleIntervalMs: cfg.metrics.sample_interval_ms,
      watchMs: cfg.metrics.watch_ms,
      idleSampleIntervalMs: cfg.metrics.idle_sample_interval_ms,
      sampleTimeoutMs: cfg.metrics.sample_timeout_ms,
      maxConcurrentSamples: cfg.metrics.max_concurrent_samples,
      historySamples: cfg.metrics.history_samples,
    },
    volumes: {
      sizeBytes: cfg.volumes.size_mib * 1048576,
      maxMountsPerSandbox: cfg.volumes.max_mounts_per_sandbox,
      detachTimeoutMs: cfg.volumes.detach_timeout_ms,
    },
    logs: {
      maxEntriesPerSandbox: cfg.logs.max_entries_per_sandbox,
      maxLineBytes: cfg.logs.max_line_bytes,
      flushIntervalMs: cfg.logs.flush_interval_ms,
      maxPendingLines: cfg.logs.max_pending_lines,
    },
  };
}
