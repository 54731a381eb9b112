/**
 * Wiring of scheduler reporting into a node: `[observability.scheduler_report]` +
 * `[cluster] scheduler_endpoint` (env: AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED,
 * AENV_OBSERVABILITY_SCHEDULER_ENDPOINT, AENV_OBSERVABILITY_REPORT_INTERVAL_SECS), the
 * orchestrator as snapshot source, and its state changes as sandbox events.
 */
import { ConfigError, type Config } from "../config/index.ts";
import { SchedulerReporter, type ReporterOptions } from "./reporter.ts";
import type { NodeIdentityInfo } from "../observability/snapshot.ts";
import { LIVE_STATES, type SandboxService } from "../orchestrator/index.ts";

/**
 * The reporter's options, or null when reporting is off.
 * @throws ConfigError when reporting is on without a scheduler endpoint.
 */
export function reporterOptions(cfg: Config): ReporterOptions | null {
  const r = cfg.observability.scheduler_report;
  if (!r.enabled) return null;
  const endpoint = cfg.cluster.scheduler_endpoint;
  if (!endpoint) {
    throw new ConfigError("config.bad_value", "scheduler reporting is enabled but [cluster] scheduler_endpoint (AENV_OBSERVABILITY_SCHEDULER_ENDPOINT) is empty", { key: "cluster.scheduler_endpoint" });
  }
  return { endpoint, intervalMs: r.interval_secs * 1000, timeoutMs: r.timeout_ms, eventFlushMs: r.event_flush_ms, eventBatchMax: r.event_batch_max };
}

/** Start reporting for `orch`. @returns the stop function (unregisters the node). */
export function startReporting(o: ReporterOptions, identity: NodeIdentityInfo, orch: SandboxService): () => Promise<void> {
  const reporter = new SchedulerReporter(
    identity,
    {
      counters: () => orch.getCounters(),
      sandboxes: () => orch.inStates(LIVE_STATES).map((r) => ({ id: r.id, state: r.state, cpuCount: r.cpuCount, memoryMB: r.memoryMB })),
    },
    o,
  );
  const unobserve = orch.observe({
    onEvent: (e) => reporter.noteChange({ id: e.id, from: e.from, to: e.to, cpuCount: e.sandbox.cpuCount, memoryMB: e.sandbox.memoryMB }),
  });
  reporter.start();
  return async () => {
    unobserve();
    await reporter.close();
  };
}
