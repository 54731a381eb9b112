/**
 * The read side of the orchestrator: sandbox records and pages, resource samples, logs,
 * templates and snapshots as the API shows them. Nothing here changes a sandbox; the
 * Orchestrator (orchestrator.ts) adds the lifecycle operations on top.
 */
import type { Logger } from "pino";
import type { Db } from "../db/index.ts";
import { logger } from "../observability/log.ts";
import type { OrchestratorConfig } from "./config.ts";
import { notFound } from "./errors.ts";
import { SANDBOX_ID_RE } from "./ids.ts";
import { SandboxLogStore } from "./logs.ts";
import { MetricsHistory } from "./metrics.ts";
import { sandboxPage, snapshotPage, type SnapshotQuery } from "./pages.ts";
import type { SandboxRuntime, SnapshotInfo } from "./runtime.ts";
import { publicState, type SandboxState } from "./states.ts";
import { SandboxStore } from "./store.ts";
import type { ListSandboxesQuery, SandboxLogEntry, SandboxLogQuery, SandboxMetricsSample, SandboxRecord, TemplateListing } from "./types.ts";

/** Queries over the sandboxes of one orchestrator (`S`: its runtime's per-sandbox state). */
export abstract class SandboxReads<S> {
  readonly store: SandboxStore;
  /** Resource samples of live sandboxes (bounded per sandbox). */
  readonly metricsHistory: MetricsHistory;
  /** Sandbox log entries (database, bounded per sandbox). */
  readonly logs: SandboxLogStore;
  protected readonly log: Logger = logger("orchestrator");

  protected constructor(
    db: Db,
    readonly runtime: SandboxRuntime<S>,
    readonly config: OrchestratorConfig,
  ) {
    this.store = new SandboxStore(db);
    this.metricsHistory = new MetricsHistory(config.metrics.historySamples);
    this.logs = new SandboxLogStore(db, config.logs, this.log);
  }

  /** Templates the runtime can boot, with their persisted spawn statistics. */
  async listTemplates(): Promise<TemplateListing[]> {
    const stats = this.store.spawnStats();
    return (await this.runtime.listTemplates()).map((t) => {
      const s = stats.get(t.templateID);
      return { ...t, spawnCount: s?.spawnCount ?? 0, lastSpawnedAt: s?.lastSpawnedAt ?? null };
    });
  }

  /**
   * One page of user snapshots (oldest first) whose source is `sandboxId` and/or that carry
   * `name` (exactly, without its `:tag`, or as their id).
   * @throws OrchestratorError bad_request for a bad limit or nextToken
   */
  listSnapshots(q: SnapshotQuery): { items: SnapshotInfo[]; nextToken?: string } {
    return snapshotPage(this.runtime.snapshots?.list() ?? [], q);
  }

  /** The live record of `id`. @throws OrchestratorError not_found (404). */
  get(id: string): SandboxRecord {
    const r = SANDBOX_ID_RE.test(id) ? this.store.get(id) : undefined;
    if (!r || publicState(r.state) === null) throw notFound(id);
    return r;
  }

  /**
   * One page of live sandboxes matching `q`; `nextToken` is set when more exist.
   * @throws OrchestratorError bad_request (400) for a malformed nextToken.
   */
  list(q: ListSandboxesQuery): { items: SandboxRecord[]; nextToken?: string } {
    return sandboxPage(this.store, q);
  }

  /** Every sandbox in one of `states`. */
  inStates(states: readonly SandboxState[]): SandboxRecord[] {
    return this.store.inStates(states);
  }

  /** Number of sandboxes in state running (X-Total-Running). */
  runningCount(): number {
    const by = this.store.countByState();
    return (by.running ?? 0) + (by.creating ?? 0) + (by.resuming ?? 0);
  }

  /**
   * Resource samples of live sandbox `id` taken in [startMs, endMs] (inclusive, unix ms; open
   * ends when absent), oldest first. A paused sandbox keeps the samples it had.
   * @throws OrchestratorError not_found (404).
   */
  metrics(id: string, startMs?: number, endMs?: number): SandboxMetricsSample[] {
    this.get(id);
    return this.metricsHistory.range(id, startMs, endMs);
  }

  /**
   * The newest sample of each of `ids` that is live and has one; unknown ids are left out
   * (E2B `GET /sandboxes/metrics`).
   */
  latestMetrics(ids: readonly string[]): Map<string, SandboxMetricsSample> {
    const out = new Map<string, SandboxMetricsSample>();
    for (const id of ids) {
      const r = SANDBOX_ID_RE.test(id) ? this.store.get(id) : undefined;
      const s = r && publicState(r.state) !== null ? this.metricsHistory.latest(id) : undefined;
      if (s) out.set(id, s);
    }
    return out;
  }

  /** Log entries of live sandbox `id` (running or paused). @throws OrchestratorError not_found (404). */
  sandboxLogs(id: string, q: SandboxLogQuery): SandboxLogEntry[] {
    this.get(id);
    return this.logs.query(id, q);
  }

}
