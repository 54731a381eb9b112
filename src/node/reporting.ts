/**
 * Wiring of scheduler reporting into a node: `[observability.scheduler_report]` +
 * `[cluster] scheduler_endpoint` (env: AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED,
 * AENV_OBSERVABILITY_SCHEDULER_ENDPOINT, AENV_OBSERVABILITY_REPORT_INTERVAL_SECS), the
 * orchestrator as snapshot source, and its state changes as sandbox events.
 */
import { ConfigError, type Config } from "../config/index.ts";
import { SchedulerReporter, type ReporterOptions } from "./reporter.ts";
import type { NodeIdentityInfo } from "../observability/snapshot.ts";
import { LIVE_STATES, type Orchestrator, type SandboxService } from "../orchestrator/index.ts";
import { logger } from "../observability/log.ts";

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
  // sandboxes a stop leaves (paused, or running for the next start) keep their bindings
  const keepBindings = cfg.orchestrator.shutdown_action !== "kill";
  return { endpoint, intervalMs: r.interval_secs * 1000, timeoutMs: r.timeout_ms, eventFlushMs: r.event_flush_ms, eventBatchMax: r.event_batch_max, keepBindings };
}

/**
 * Start reporting for `orch`. Sandboxes the scheduler says another node holds now are released
 * (`orch.release`: this node's copy goes without losing data), one at a time, each once while
 * its release runs.
 * @returns the stop function (unregisters the node).
 */
export function startReporting(o: ReporterOptions, identity: NodeIdentityInfo, orch: SandboxService & Pick<Orchestrator, "release">): () => Promise<void> {
  const log = logger("reporter");
  const releasing = new Set<string>();
  let queue = Promise.resolve();
  const onForeign = (ids: string[]) => {
    for (const id of ids) {
      if (releasing.has(id)) continue;
      releasing.add(id);
      queue = queue
        .then(() => orch.release(id))
        .then((r) => log.info({ sandboxId: id, outcome: r.kind }, "sandbox held by another node: release done"))
        .finally(() => releasing.delete(id));
    }
  };
  const reporter = new SchedulerReporter(
    identity,
    {
      counters: () => orch.getCounters(),
      sandboxes: () => orch.inStates(LIVE_STATES).map((r) => ({ id: r.id, state: r.state, cpuCount: r.cpuCount, memoryMB: r.memoryMB })),
    },
    { ...o, onForeign },
  );
  const unobserve = orch.observe({
    onEvent: (e) => reporter.noteChange({ id: e.id, from: e.from, to: e.to, cpuCount: e.sandbox.cpuCount, memoryMB: e.sandbox.memoryMB }),
  });
  reporter.start();
  return async () => {
    unobserve();
    await reporter.close();
    await queue;
  };
}
