/**
 * The orchestrator: turns API requests into sandbox lifecycle operations on a SandboxRuntime.
 * Owns the state machine (states.ts), per-sandbox serialisation (lock.ts), expiry (kill or
 * pause at endAt), counters published to observers, and persistence (store.ts).
 */
import type { Logger } from "pino";
import type { Db } from "../db/index.ts";
import { logger } from "../observability/log.ts";
import type { OrchestratorConfig } from "./config.ts";
import { isRequestFault, notFound, OrchestratorError } from "./errors.ts";
import { newSandboxId, randomHex, SANDBOX_ID_RE } from "./ids.ts";
import { KeyedLock } from "./lock.ts";
import { SandboxLogStore } from "./logs.ts";
import { MetricsHistory, MetricsSampler } from "./metrics.ts";
import { VolumeManager } from "./volumes.ts";
import { AgentEnvError } from "../errors.ts";
import type { GuestTarget, RuntimeKnownSandbox, RuntimeSandbox, RuntimeStartSpec, SandboxRuntime, SnapshotInfo, SnapshotRequest } from "./runtime.ts";
import { asError, errorMessage } from "../util/error.ts";
import { Semaphore } from "./semaphore.ts";
import { assertTransition, LIVE_STATES, publicState, type SandboxState } from "./states.ts";
import { FORK_DEFAULT_TIMEOUT_SECS, MAX_FORK_COUNT, type ConnectResult, type ForkResult, type OrchestratorObserver, type SandboxEvent, type SandboxNote, type SandboxService, type StopReason } from "./service.ts";
import { SandboxStore, type ListCursor } from "./store.ts";
import type {
  CreateSandboxRequest, ListSandboxesQuery, OrchestratorCounters, SandboxLogEntry, SandboxLogQuery, SandboxMetricsSample, SandboxRecord, TemplateInfo,
  TemplateListing,
} from "./types.ts";

/** A state change, as published to observers. */
/** What `Orchestrator.close()` did with the live sandboxes. */
export interface ShutdownSummary {
  killed: number;
  paused: number;
  /** Sandboxes whose kill or pause threw (logged individually). */
  failed: number;
}

/**
 * The sandbox lifecycle over runtime `runtime`, whose per-sandbox state is `S` (persisted as
 * JSON, read back through `runtime.state`).
 */
export class Orchestrator<S = unknown> implements SandboxService {
  readonly store: SandboxStore;
  /** Resource samples of live sandboxes (bounded per sandbox). */
  readonly metricsHistory: MetricsHistory;
  /** Sandbox log entries (database, bounded per sandbox). */
  readonly logs: SandboxLogStore;
  /** Volumes and who holds them. */
  readonly volumes: VolumeManager;
  private readonly sampler: MetricsSampler;
  private readonly lock: KeyedLock;
  private readonly starts: Semaphore;
  private readonly log: Logger = logger("orchestrator");
  private readonly observers = new Set<OrchestratorObserver>();
  private readonly counters: OrchestratorCounters = { running: 0, paused: 0, starting: 0, created: 0, failed: 0, killed: 0 };
  private evictTimer: ReturnType<typeof setInterval> | undefined;
  private readonly inflight = new Set<Promise<unknown>>();
  /** Sandboxes whose expiry action is queued or running: later ticks must not queue it again. */
  private readonly expiring = new Set<string>();
  /** Per-sandbox count of VM starts (create/resume), to tell a stale VM exit from a live one. */
  private readonly generations = new Map<string, number>();
  private lastGeneration = 0;
  private readonly shutdown = new AbortController();
  private closed = false;

  constructor(
    db: Db,
    readonly runtime: SandboxRuntime<S>,
    readonly config: OrchestratorConfig,
    private readonly now: () => number = Date.now,
  ) {
    this.store = new SandboxStore(db);
    this.lock = new KeyedLock(config.lockWaitMs, config.lockMaxWaiters);
    this.starts = new Semaphore(config.maxConcurrentStarts);
    this.metricsHistory = new MetricsHistory(config.metrics.historySamples);
    this.logs = new SandboxLogStore(db, config.logs, this.log);
    this.volumes = new VolumeManager(
      db,
      runtime.volumes,
      { ...config.volumes, lockWaitMs: config.lockWaitMs },
      () => this.store.inStates(["creating", "running", "pausing", "paused", "resuming", "killing"]),
      runtime.volumes ? (holder, mount) => runtime.volumes!.guestFiles(targetOf(holder), mount.path) : undefined,
      now,
    );
    this.sampler = new MetricsSampler(
      runtime.metrics,
      this.metricsHistory,
      () =>
        this.store
          .inStates(["running"])
          .filter((r) => r.endpoint)
          .map(targetOf),
      { intervalMs: config.metrics.sampleIntervalMs, timeoutMs: config.metrics.sampleTimeoutMs },
      now,
      this.log,
    );
  }

  /**
   * Reconcile with what a previous run left, then start the expiry loop. Sandboxes that were
   * in any state but `paused` cannot continue (their VMM died with the node or is orphaned):
   * the runtime stops and frees them and they become `killed`. Paused ones stay paused.
   */
  async start(): Promise<void> {
    const left = this.store.inStates(["creating", "running", "pausing", "resuming", "killing", "failed", "paused"]);
    const report = await this.runtime.reap(left.map((r) => this.known(r)));
    const t = this.now();
    for (const r of left) {
      if (r.state === "paused") continue;
      // "resuming"/"pausing" may have left a usable snapshot, but its completeness is unknown: discard
      const sandbox = this.store.update(r.id, { state: "killed", error: r.error ?? `node restarted while ${r.state}`, endpoint: null }, t)!;
      this.emit({ id: r.id, from: r.state, to: "killed", at: t, sandbox, reason: "orphaned" });
      this.log.warn({ sandboxId: r.id, was: r.state }, "sandbox did not survive the node restart");
    }
    this.log.info({ stoppedVms: report.stoppedVms.length, removed: report.removed.length, paused: left.filter((r) => r.state === "paused").length }, "start-up reconciliation done");
    this.store.prune(t - this.config.killedRetentionSecs * 1000);
    this.logs.pruneOrphans();
    this.logs.start();
    this.recount();
    this.evictTimer = setInterval(() => this.evictTick(), this.config.evictIntervalMs);
    this.sampler.start();
  }

  /**
   * Stop the expiry loop, wait for operations in flight, then kill (or pause, per
   * `shutdown_action`) every live sandbox, log one summary line, and close the runtime.
   * @returns how many sandboxes were killed, paused, or failed to stop (all 0 on a second call).
   */
  async close(): Promise<ShutdownSummary> {
    const summary: ShutdownSummary = { killed: 0, paused: 0, failed: 0 };
    if (this.closed) return summary;
    this.closed = true;
    clearInterval(this.evictTimer);
    await this.sampler.stop();
    this.runtime.beginShutdown();
    this.shutdown.abort(new OrchestratorError("orchestrator.shutting_down", "node is shutting down"));
    await Promise.allSettled([...this.inflight]);
    const live = this.store.inStates(["running", "creating", "resuming", "pausing"]);
    const results = await Promise.allSettled(
      live.map(async (r) => {
        if (this.config.shutdownAction === "pause" && r.state === "running") {
          await this.pauseNow(r.id, true, "shutdown");
          return "paused" as const;
        }
        await this.killNow(r.id, true, "shutdown");
        return "killed" as const;
      }),
    );
    results.forEach((x, i) => {
      summary[x.status === "fulfilled" ? x.value : "failed"]++;
      if (x.status === "rejected") this.log.warn({ sandboxId: live[i]!.id, err: x.reason }, "shutdown: sandbox did not stop");
    });
    this.log.info(summary, `shutdown: killed ${summary.killed}, paused ${summary.paused} sandboxes${summary.failed ? `, ${summary.failed} failed to stop` : ""}`);
    await this.runtime.close();
    this.logs.close();
    return summary;
  }

  /** Subscribe; returns the unsubscribe function. The observer gets the counters at once. */
  observe(o: OrchestratorObserver): () => void {
    this.observers.add(o);
    o.onCounters?.({ ...this.counters });
    return () => this.observers.delete(o);
  }

  /** A copy of the current counters. */
  getCounters(): OrchestratorCounters {
    return { ...this.counters };
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
   * Create and boot a sandbox; resolves once envd is initialised.
   * @throws OrchestratorError template_not_found (404), bad_request (400), capacity (429),
   *   create_failed (500), shutting_down (503).
   */
  async create(req: CreateSandboxRequest): Promise<SandboxRecord> {
    this.assertOpen();
    const timeoutSecs = this.checkTimeout(req.timeoutSecs ?? this.config.defaultTimeoutSecs);
    if (req.autoPauseMemory === false && req.autoResume === true) {
      // E2B: traffic must not cold-boot a sandbox, so a filesystem-only auto-pause excludes autoResume
      throw new OrchestratorError("orchestrator.bad_request", "autoPauseMemory: false cannot be combined with autoResume: a filesystem-only snapshot is resumed explicitly (connect), never by traffic", {
        autoPauseMemory: false,
        autoResume: true,
      });
    }
    this.runtime.network?.check(req.network ?? null, req.allowInternetAccess ?? null);
    // checked now for a prompt 400/409, and again just before the record is inserted (holders may change meanwhile)
    this.volumes.resolveMounts(req.volumeMounts ?? []);
    const tpl = await this.findTemplate(req.template);
    if (!tpl) throw new OrchestratorError("orchestrator.template_not_found", `template '${req.template}' not found`, { template: req.template });
    return this.createWith(req, tpl, timeoutSecs, { templateId: tpl.templateID, alias: tpl.aliases.includes(req.template) ? req.template : (tpl.aliases[0] ?? null) });
  }

  /** A template by id, alias or `name:tag` (the tagged build), or a snapshot by id or name. */
  private async findTemplate(ref: string): Promise<TemplateInfo | undefined> {
    return (await this.runtime.resolveTemplate(ref)) ?? undefined;
  }

  /**
   * Create a sandbox started from `tpl` (a template, or a snapshot seen as one), recorded as
   * `shown`. Its id is one the runtime prepared a start for (claimPrepared), when it has one.
   */
  private async createWith(req: CreateSandboxRequest, tpl: TemplateInfo, timeoutSecs: number, shown: { templateId: string; alias: string | null }): Promise<SandboxRecord> {
    const { cpuCount, memoryMB } = this.checkResources(req.cpuCount ?? tpl.cpuCount, req.memoryMB ?? tpl.memoryMB, req.cpuCount !== undefined || req.memoryMB !== undefined);
    const live = this.counters.running + this.counters.starting;
    if (live >= this.config.maxSandboxes) {
      throw new OrchestratorError("orchestrator.capacity", `node is at its limit of ${this.config.maxSandboxes} concurrent sandboxes`, { limit: this.config.maxSandboxes });
    }
    const volumeMounts = this.volumes.resolveMounts(req.volumeMounts ?? []);
    const prepared = await this.runtime.prepared?.claim(tpl, { cpuCount, memoryMB, volumes: volumeMounts.length }).catch((e) => {
      this.log.warn({ template: tpl.templateID, err: e }, "no prepared sandbox claimed");
      return null;
    });
    // checked again: other creates may have started while the claim was looked up (a claimed
    // start not used lapses in the runtime)
    if (this.counters.running + this.counters.starting >= this.config.maxSandboxes) {
      throw new OrchestratorError("orchestrator.capacity", `node is at its limit of ${this.config.maxSandboxes} concurrent sandboxes`, { limit: this.config.maxSandboxes });
    }
    const id = prepared && SANDBOX_ID_RE.test(prepared) && !this.store.get(prepared) ? prepared : newSandboxId();
    const t = this.now();
    const rec: SandboxRecord = {
      id,
      templateId: shown.templateId,
      alias: shown.alias,
      state: "creating",
      cpuCount,
      memoryMB,
      diskSizeMB: tpl.diskSizeMB,
      envdVersion: tpl.envdVersion,
      envdAccessToken: req.secure ? randomHex(32) : null,
      // E2B: network.allowPublicTraffic=false makes non-envd ports require this token
      trafficAccessToken: req.network?.allowPublicTraffic === false ? randomHex(32) : null,
      metadata: req.metadata ?? {},
      envVars: req.envVars ?? {},
      autoPause: req.autoPause ?? false,
      autoPauseMemory: req.autoPauseMemory ?? true,
      snapshotKind: null,
      autoResume: req.autoResume ?? false,
      allowInternetAccess: req.allowInternetAccess ?? null,
      network: req.network ?? null,
      volumeMounts,
      endpoint: null,
      runtimeState: null,
      error: null,
      createdAt: t,
      startedAt: t,
      endAt: t + timeoutSecs * 1000,
      updatedAt: t,
    };
    this.store.insert(rec);
    this.counters.starting++;
    this.emit({ id, from: null, to: "creating", at: t, sandbox: rec });
    return this.track(
      this.lock.run(id, async () => {
        try {
          const started = await this.withStartSlot(this.config.createTimeoutMs, async (signal) => {
            if (rec.volumeMounts.length > 0) await this.volumes.prepareAttach(rec);
            return this.runtime.start(this.startSpec(rec, tpl, signal));
          });
          const now = this.now();
          this.transition(id, "creating", "running", {
            endpoint: started.endpoint,
            runtimeState: started.runtimeState,
            envdVersion: started.envdVersion,
            startedAt: now,
            endAt: now + timeoutSecs * 1000,
          });
          this.counters.created++;
          this.store.recordSpawn(shown.templateId, now);
          this.watchExit(id, started);
          return this.store.get(id)!;
        } catch (e) {
          this.counters.failed++;
          this.transition(id, "creating", "failed", { error: errorMessage(e) });
          this.log.error({ sandboxId: id, err: e }, "create failed");
          if (isRequestFault(e)) throw e;
          throw new OrchestratorError("orchestrator.create_failed", `failed to create sandbox: ${errorMessage(e)}`, { sandboxId: id, template: tpl.templateID }, { cause: e });
        } finally {
          this.counters.starting--;
          this.recount();
        }
      }),
    );
  }

  /**
   * Commit a snapshot of a running or paused sandbox (E2B `POST /sandboxes/{id}/snapshots`): a
   * running one is paused briefly and runs on with the same id and expiry.
   * @throws OrchestratorError not_found, conflict (while it changes state), bad_request (bad
   *   name, volumes attached, runtime without snapshots), runtime_failed
   */
  createSnapshot(id: string, name?: string): Promise<SnapshotInfo> {
    this.assertOpen();
    this.get(id);
    return this.track(this.lock.run(id, () => this.snapshotLocked(id, { kind: "user", name })));
  }

  /**
   * E2B fork: snapshot the sandbox once (it runs on, same id and expiry), then create `count`
   * sandboxes from that checkpoint with the parent's settings (env vars, metadata, network,
   * lifecycle, shape) and their own lifetime `timeoutSecs` (E2B's default 15). One result per
   * child: a child that fails to start is an error entry, not a failure of the call. The
   * checkpoint is removed once no child runs from it.
   * @throws OrchestratorError not_found, conflict, bad_request (before any child is attempted)
   */
  async fork(id: string, opts: { count?: number; timeoutSecs?: number }): Promise<ForkResult[]> {
    this.assertOpen();
    const count = opts.count ?? 1;
    if (!Number.isInteger(count) || count < 1 || count > MAX_FORK_COUNT) {
      throw new OrchestratorError("orchestrator.bad_request", `count must be an integer between 1 and ${MAX_FORK_COUNT}, got ${count}`, { count });
    }
    const timeoutSecs = this.checkTimeout(opts.timeoutSecs ?? FORK_DEFAULT_TIMEOUT_SECS);
    this.get(id);
    const snap = await this.track(this.lock.run(id, () => this.snapshotLocked(id, { kind: "fork" })));
    const parent = this.store.get(id)!;
    try {
      const tpl = await this.findTemplate(snap.snapshotID);
      if (!tpl) throw new OrchestratorError("orchestrator.runtime_failed", `fork checkpoint ${snap.snapshotID} of ${id} vanished`, { sandboxId: id });
      const req: CreateSandboxRequest = {
        template: snap.snapshotID,
        timeoutSecs,
        autoPause: parent.autoPause,
        autoResume: parent.autoResume,
        metadata: parent.metadata,
        envVars: parent.envVars,
        secure: parent.envdAccessToken !== null,
        allowInternetAccess: parent.allowInternetAccess ?? undefined,
        network: parent.network ?? undefined,
        cpuCount: parent.cpuCount,
        memoryMB: parent.memoryMB,
      };
      const results = await Promise.allSettled(
        Array.from({ length: count }, async () => {
          this.assertOpen();
          const child = await this.createWith(req, tpl, timeoutSecs, { templateId: parent.templateId, alias: parent.alias });
          this.note({ kind: "forked", id: child.id, at: this.now(), sandbox: child, sourceId: id });
          return child;
        }),
      );
      return results.map((x) => (x.status === "fulfilled" ? { sandbox: x.value } : { error: asError(x.reason) }));
    } finally {
      await this.runtime.snapshots?.delete(snap.snapshotID).catch((e) => this.log.error({ sandboxId: id, err: e }, "dropping the fork checkpoint failed"));
    }
  }

  /**
   * One page of user snapshots (oldest first) whose source is `sandboxId` and/or that carry
   * `name` (exactly, without its `:tag`, or as their id).
   * @throws OrchestratorError bad_request for a bad limit or nextToken
   */
  listSnapshots(q: { sandboxId?: string; name?: string; limit?: number; nextToken?: string }): { items: SnapshotInfo[]; nextToken?: string } {
    const limit = q.limit ?? 100;
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw new OrchestratorError("orchestrator.bad_request", `limit must be between 1 and 100, got ${limit}`, { limit });
    const after = q.nextToken ? decodeCursor(q.nextToken) : undefined;
    const all = (this.runtime.snapshots?.list() ?? []).filter(
      (s) =>
        (q.sandboxId === undefined || s.sandboxID === q.sandboxId) &&
        (q.name === undefined || s.snapshotID === q.name || s.names.some((n) => n === q.name || n.replace(/:[^:/]*$/, "") === q.name)) &&
        (!after || s.createdAt > after.startedAt || (s.createdAt === after.startedAt && s.snapshotID > after.id)),
    );
    const items = all.slice(0, limit);
    const last = items[items.length - 1];
    return { items, nextToken: all.length > limit && last ? encodeCursor({ startedAt: last.createdAt, id: last.snapshotID }) : undefined };
  }

  /**
   * Delete a snapshot by id or name (E2B deletes snapshots through `DELETE /templates/{id}`).
   * Sandboxes running from it keep it until they stop.
   * @returns false when there is no such snapshot
   */
  async deleteSnapshot(ref: string): Promise<boolean> {
    return (await this.runtime.snapshots?.delete(ref)) ?? false;
  }

  private async snapshotLocked(id: string, req: Omit<SnapshotRequest, "volumes">): Promise<SnapshotInfo> {
    const r = this.get(id);
    if (r.state !== "running" && r.state !== "paused") throw new OrchestratorError("orchestrator.conflict", `sandbox ${id} is ${r.state}`, { sandboxId: id, state: r.state });
    const snapshots = this.runtime.snapshots;
    if (!snapshots) throw new OrchestratorError("orchestrator.bad_request", `runtime ${this.runtime.name} cannot take snapshots`, { sandboxId: id });
    try {
      const snap = await snapshots.take(id, this.stateOf(r), { ...req, volumes: r.volumeMounts.length }, AbortSignal.any([AbortSignal.timeout(this.config.pauseTimeoutMs), this.shutdown.signal]));
      this.note({ kind: "snapshot", id, at: this.now(), sandbox: this.store.get(id)!, snapshotId: snap.snapshotID, names: snap.names, purpose: req.kind === "fork" ? "fork" : "user" });
      return snap;
    } catch (e) {
      if (isRequestFault(e)) throw e;
      const code = e instanceof AgentEnvError ? `[${e.code}] ` : "";
      throw new OrchestratorError("orchestrator.runtime_failed", `failed to snapshot sandbox ${id}: ${code}${errorMessage(e)}`, { sandboxId: id, cause: e instanceof AgentEnvError ? e.code : null }, { cause: e });
    }
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
    const want = q.states ?? ["running", "paused"];
    const states = LIVE_STATES.filter((s) => want.includes(publicState(s)!));
    let cursor: ListCursor | undefined;
    if (q.nextToken) cursor = decodeCursor(q.nextToken);
    const md = Object.entries(q.metadata ?? {});
    const { items, more } = this.store.page({
      states,
      // E2B's spec and SDK 2.51 (`SandboxListOpts.order`): newest first unless asked otherwise
      order: q.order ?? "desc",
      limit: q.limit ?? 100,
      cursor,
      template: q.template,
      startedAfter: q.startedAfter,
      keep: (r) => md.every(([k, v]) => r.metadata[k] === v),
    });
    const last = items[items.length - 1];
    return { items, nextToken: more && last ? encodeCursor({ startedAt: last.startedAt, id: last.id }) : undefined };
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

  /** Kill a live sandbox. @throws OrchestratorError not_found (404), busy (409). */
  kill(id: string): Promise<void> {
    this.get(id);
    return this.track(this.killNow(id, false, "request"));
  }

  /**
   * Pause a running sandbox; `memory: false` keeps only its disk (a filesystem-only snapshot:
   * the next resume cold-boots it).
   * @throws not_found (404), conflict (409 when already paused).
   */
  pause(id: string, opts: { memory?: boolean } = {}): Promise<void> {
    this.assertOpen();
    this.get(id);
    return this.track(this.pauseNow(id, opts.memory ?? true, "request"));
  }

  /**
   * E2B connect: a running sandbox gets its TTL extended (if the new end is later) -> resumed
   * false; a paused one is resumed with TTL now + timeout -> resumed true. A filesystem-only
   * snapshot, or `memory: false` (the SDK's onResume "reboot"), cold-boots it on its disk.
   * @throws not_found (404), bad_request (400, timeout out of range).
   */
  connect(id: string, timeoutSecs?: number, opts: { memory?: boolean } = {}): Promise<ConnectResult> {
    return this.underLockWithTimeout(id, timeoutSecs, async (r, secs) => {
      if (r.state === "paused") return { sandbox: await this.resumeLocked(r, secs, opts.memory ?? true), resumed: true };
      this.setEndAt(r, Math.max(r.endAt, this.now() + secs * 1000));
      return { sandbox: this.store.get(id)!, resumed: false };
    });
  }

  /** Deprecated E2B resume: 409 when running; `memory: false` as for connect. @throws not_found (404), conflict (409). */
  resume(id: string, timeoutSecs?: number, opts: { memory?: boolean } = {}): Promise<SandboxRecord> {
    return this.underLockWithTimeout(id, timeoutSecs, (r, secs) => {
      if (r.state !== "paused") throw new OrchestratorError("orchestrator.conflict", `sandbox ${id} is already running`, { sandboxId: id, state: r.state });
      return this.resumeLocked(r, secs, opts.memory ?? true);
    });
  }

  /**
   * The checks of connect and resume (node open, timeout in range, `id` live; thrown at the call),
   * then `fn` with the record as it is under the sandbox's lock and the timeout in seconds.
   */
  private underLockWithTimeout<T>(id: string, timeoutSecs: number | undefined, fn: (r: SandboxRecord, secs: number) => Promise<T>): Promise<T> {
    this.assertOpen();
    const secs = this.checkTimeout(timeoutSecs ?? this.config.defaultTimeoutSecs);
    this.get(id);
    return this.track(this.lock.run(id, () => fn(this.get(id), secs)));
  }

  /** Set endAt = now + `secs` (may shorten). @throws not_found (404), bad_request (400). */
  setTimeout(id: string, secs: number): Promise<void> {
    this.checkTimeout(secs);
    this.get(id);
    return this.lock.run(id, async () => {
      this.setEndAt(this.get(id), this.now() + secs * 1000);
    });
  }

  /** Keep alive for `secs` more: endAt = max(endAt, now + secs). @throws not_found (404). */
  refresh(id: string, secs: number): Promise<void> {
    this.get(id);
    return this.lock.run(id, async () => {
      const r = this.get(id);
      this.setEndAt(r, Math.max(r.endAt, this.now() + secs * 1000));
    });
  }

  /**
   * Replace the egress policy of a running sandbox (runtime applies it; record keeps it).
   * @throws not_found (404), conflict (409 when not running), bad_request (400 when unsupported).
   */
  updateNetwork(id: string, policy: Record<string, unknown>): Promise<void> {
    this.get(id);
    return this.lock.run(id, async () => {
      const r = this.get(id);
      if (r.state !== "running") throw new OrchestratorError("orchestrator.conflict", `sandbox ${id} is not running`, { sandboxId: id, state: r.state });
      const network = this.runtime.network;
      if (!network) throw new OrchestratorError("orchestrator.bad_request", `runtime ${this.runtime.name} cannot change network policy`, { sandboxId: id });
      await network.update(id, policy);
      // the body replaces the policy (an omitted field clears it): keep exactly what was applied,
      // so a resume or restart rebuilds the same rules
      const flag = policy.allow_internet_access ?? policy.allowInternetAccess;
      const sandbox = this.store.update(id, { network: policy, allowInternetAccess: typeof flag === "boolean" ? flag : null }, this.now())!;
      this.note({ kind: "network", id, at: this.now(), sandbox });
    });
  }

  // ---- internals ----

  private async killNow(id: string, force: boolean, reason: StopReason): Promise<void> {
    await this.lock.run(id, async () => {
      const r = this.store.get(id);
      if (!r || (publicState(r.state) === null && !(force && r.state === "failed"))) throw notFound(id);
      this.generations.delete(id);
      const wasRunning = r.state === "running" && r.endpoint !== null;
      this.transition(id, r.state, "killing", {}, reason);
      if (wasRunning && r.volumeMounts.some((m) => !m.readOnly)) {
        // the volume outlives the sandbox: flush and unmount it in the guest before the VM dies
        await this.runtime
          .quiesce(targetOf(r), r.volumeMounts, this.config.volumes.detachTimeoutMs)
          .catch((e) => this.log.warn({ sandboxId: id, err: e }, "could not unmount the volumes in the guest before the kill; their journals will be replayed"));
      }
      try {
        await this.runtime.kill(id, this.stateForKill(r));
      } catch (e) {
        this.transition(id, "killing", "failed", { error: `kill failed: ${errorMessage(e)}` });
        throw new OrchestratorError("orchestrator.runtime_failed", `failed to kill sandbox ${id}: ${errorMessage(e)}`, { sandboxId: id }, { cause: e });
      }
      this.transition(id, "killing", "killed", { endpoint: null, runtimeState: null }, reason);
      this.counters.killed++;
      this.recount();
    });
  }

  private async pauseNow(id: string, memory: boolean, reason: StopReason): Promise<void> {
    await this.lock.run(id, async () => {
      const r = this.get(id);
      if (r.state === "paused") throw new OrchestratorError("orchestrator.conflict", `sandbox ${id} is already paused`, { sandboxId: id });
      this.generations.delete(id);
      this.transition(id, "running", "pausing", {}, reason);
      const signal = AbortSignal.timeout(this.config.pauseTimeoutMs);
      try {
        if (!memory && r.endpoint) {
          // only the disk is kept: flush the guest's filesystems and unmount its volumes first
          await this.runtime.quiesce(targetOf(r), r.volumeMounts, this.config.volumes.detachTimeoutMs).catch((e) => {
            this.log.warn({ sandboxId: id, err: e }, "could not flush the guest before a filesystem-only pause; writes not yet on disk are lost");
          });
        }
        const st = await this.runtime.pause(id, this.stateOf(r), signal, { memory });
        this.transition(id, "pausing", "paused", { runtimeState: st, endpoint: null, snapshotKind: memory ? "memory" : "filesystem" }, reason);
      } catch (e) {
        // the runtime leaves the VM running when a pause fails before the VMM is stopped
        this.transition(id, "pausing", "failed", { error: `pause failed: ${errorMessage(e)}` });
        await this.runtime.kill(id, this.stateForKill(r)).catch(() => {});
        this.recount();
        throw new OrchestratorError("orchestrator.runtime_failed", `failed to pause sandbox ${id}: ${errorMessage(e)}`, { sandboxId: id }, { cause: e });
      }
      this.recount();
    });
  }

  /** Resume paused `r`: restore its memory snapshot, or cold-boot it on its disk (filesystem-only snapshot, or `memory` false). */
  private async resumeLocked(r: SandboxRecord, secs: number, memory: boolean): Promise<SandboxRecord> {
    const tpl = (await this.runtime.listTemplates()).find((t) => t.templateID === r.templateId);
    const coldBoot = r.snapshotKind === "filesystem" || !memory;
    this.transition(r.id, "paused", "resuming", {});
    this.counters.starting++;
    try {
      const started = await this.withStartSlot(this.config.createTimeoutMs, (signal) =>
        this.runtime.resume(this.startSpec(r, tpl ?? templateOf(r), signal), this.stateOf(r), { memory: !coldBoot }),
      );
      const now = this.now();
      this.transition(r.id, "resuming", "running", {
        endpoint: started.endpoint,
        runtimeState: started.runtimeState,
        envdVersion: started.envdVersion,
        endAt: now + secs * 1000,
        snapshotKind: null,
      });
      if (coldBoot) this.logs.append(r.id, { at: now, level: "info", source: "lifecycle", message: "sandbox cold-booted on its disk (no memory restored)", fields: {} });
      this.watchExit(r.id, started);
      return this.store.get(r.id)!;
    } catch (e) {
      this.transition(r.id, "resuming", "paused", { error: `resume failed: ${errorMessage(e)}` });
      throw new OrchestratorError("orchestrator.runtime_failed", `failed to resume sandbox ${r.id}: ${errorMessage(e)}`, { sandboxId: r.id }, { cause: e });
    } finally {
      this.counters.starting--;
      this.recount();
    }
  }

  private async withStartSlot<T>(timeoutMs: number, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const signal = AbortSignal.any([AbortSignal.timeout(timeoutMs), this.shutdown.signal]);
    const release = await this.starts.acquire(signal);
    try {
      return await fn(signal);
    } finally {
      release();
    }
  }

  private startSpec(r: SandboxRecord, template: TemplateInfo, signal: AbortSignal): RuntimeStartSpec {
    return {
      id: r.id,
      template,
      cpuCount: r.cpuCount,
      memoryMB: r.memoryMB,
      envVars: r.envVars,
      envdAccessToken: r.envdAccessToken,
      allowInternetAccess: r.allowInternetAccess,
      network: r.network,
      volumes: r.volumeMounts,
      signal,
      onLog: (line) => this.logs.append(r.id, { ...line, fields: line.fields ?? {} }),
    };
  }

  /**
   * When the VMM dies by itself, or the runtime reports the sandbox lost (its disk device
   * removed), the sandbox becomes failed and its leftovers are freed. Each start/resume gets a
   * node-wide unique generation number; an end of an older generation (the VM a pause or kill
   * stopped) is ignored.
   */
  private watchExit(id: string, started: RuntimeSandbox<S>): void {
    const gen = ++this.lastGeneration;
    this.generations.set(id, gen);
    const ends: Promise<string>[] = [];
    if (started.exited) ends.push(started.exited.then(() => "sandbox VM exited unexpectedly"));
    if (started.lost) ends.push(started.lost);
    if (ends.length === 0) return;
    void Promise.race(ends).then((why) => {
      if (this.closed || this.generations.get(id) !== gen) return;
      void this.lock
        .run(id, async () => {
          const r = this.store.get(id);
          if (!r || r.state !== "running" || this.generations.get(id) !== gen) return;
          this.generations.delete(id);
          this.log.error({ sandboxId: id, reason: why }, `sandbox failed: ${why}`);
          this.transition(id, "running", "failed", { error: why, endpoint: null });
          await this.runtime.kill(id, this.stateForKill(r)).catch((e) => this.log.error({ sandboxId: id, err: e }, "clean-up after exit failed"));
          this.recount();
        })
        .catch((e) => this.log.error({ sandboxId: id, err: e }, "exit watcher failed"));
    });
  }

  private evictTick(): void {
    const t = this.now();
    for (const { id, autoPause, autoPauseMemory } of this.store.expired(t)) {
      if (this.expiring.has(id)) continue;
      this.expiring.add(id);
      this.log.info({ sandboxId: id, action: autoPause ? "pause" : "kill" }, "sandbox timeout reached");
      const op = autoPause ? this.pauseNow(id, autoPauseMemory, "timeout") : this.killNow(id, false, "timeout");
      this.track(op)
        .catch((e) => {
          if (!(e instanceof OrchestratorError && e.code === "orchestrator.not_found")) this.log.error({ sandboxId: id, err: e }, "expiry action failed");
        })
        .finally(() => this.expiring.delete(id));
    }
  }

  /**
   * The runtime's state of `r`, read back from the database.
   * @throws OrchestratorError `orchestrator.bad_runtime_state` when it does not parse (or is none)
   */
  private stateOf(r: SandboxRecord): S {
    return this.runtime.state.parse(r.id, r.runtimeState);
  }

  /** The runtime's state of `r` for a kill: null when it has none or it does not parse (logged: the sandbox still goes). */
  private stateForKill(r: SandboxRecord): S | null {
    if (r.runtimeState == null) return null;
    try {
      return this.stateOf(r);
    } catch (e) {
      this.log.warn({ sandboxId: r.id, err: e }, "kill of a sandbox whose runtime state does not parse");
      return null;
    }
  }

  /** `r` as start-up reconciliation sees it: its state read back, or why it cannot be. */
  private known(r: SandboxRecord): RuntimeKnownSandbox<S> {
    if (r.runtimeState == null) return { id: r.id, state: r.state, runtimeState: null };
    try {
      return { id: r.id, state: r.state, runtimeState: this.stateOf(r) };
    } catch (e) {
      return { id: r.id, state: r.state, runtimeState: null, unreadable: asError(e) };
    }
  }

  private transition(id: string, from: SandboxState, to: SandboxState, fields: Partial<SandboxRecord>, reason?: StopReason): void {
    assertTransition(id, from, to);
    const t = this.now();
    const sandbox = this.store.update(id, { ...fields, state: to }, t);
    if (!sandbox) throw notFound(id); // a record vanished under its own lock: a bug, surfaced
    this.emit({ id, from, to, at: t, sandbox, ...(reason ? { reason } : {}) }, fields.error ?? null);
  }

  /** Store a new end time of `r`; observers hear of it when it changed. */
  private setEndAt(r: SandboxRecord, endAt: number): void {
    const sandbox = this.store.update(r.id, { endAt }, this.now())!;
    if (endAt !== r.endAt) this.note({ kind: "timeout", id: r.id, at: this.now(), sandbox });
  }

  /** Tell observers of a change that is not a state change (a snapshot, a fork child, a new end time or policy). */
  private note(n: SandboxNote): void {
    for (const o of this.observers) {
      try {
        o.onNote?.(n);
      } catch (err) {
        this.log.error({ err }, "observer failed");
      }
    }
  }

  private emit(e: SandboxEvent, error: string | null = null): void {
    this.logs.append(e.id, lifecycleEntry(e, error));
    if (e.to === "killed" || e.to === "failed") this.metricsHistory.drop(e.id);
    for (const o of this.observers) {
      try {
        o.onEvent?.(e);
      } catch (err) {
        this.log.error({ err }, "observer failed");
      }
    }
  }

  private recount(): void {
    const by = this.store.countByState();
    this.counters.running = (by.running ?? 0) + (by.pausing ?? 0);
    this.counters.paused = by.paused ?? 0;
    for (const o of this.observers) {
      try {
        o.onCounters?.({ ...this.counters });
      } catch (err) {
        this.log.error({ err }, "observer failed");
      }
    }
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.inflight.add(p);
    void p.then(
      () => this.inflight.delete(p),
      () => this.inflight.delete(p),
    );
    return p;
  }

  /**
   * vCPUs and memory within this node's limits.
   * @throws OrchestratorError bad_request (400) naming the limit (config key) a value passes.
   */
  private checkResources(cpuCount: number, memoryMB: number, requested: boolean): { cpuCount: number; memoryMB: number } {
    const from = requested ? "requested" : "template's";
    if (!Number.isInteger(cpuCount) || cpuCount < 1 || cpuCount > this.config.maxCpuCount) {
      throw new OrchestratorError(
        "orchestrator.bad_request",
        `cpuCount ${cpuCount} (${from}) is outside 1..${this.config.maxCpuCount}, this node's limit [orchestrator] max_cpu_count`,
        { cpuCount, limit: this.config.maxCpuCount, key: "orchestrator.max_cpu_count" },
      );
    }
    if (!Number.isInteger(memoryMB) || memoryMB < 128 || memoryMB > this.config.maxMemoryMB) {
      throw new OrchestratorError(
        "orchestrator.bad_request",
        `memoryMB ${memoryMB} (${from}) is outside 128..${this.config.maxMemoryMB}, this node's limit [orchestrator] max_memory_mb`,
        { memoryMB, limit: this.config.maxMemoryMB, key: "orchestrator.max_memory_mb" },
      );
    }
    return { cpuCount, memoryMB };
  }

  private checkTimeout(secs: number): number {
    if (!Number.isInteger(secs) || secs < 0 || secs > this.config.maxTimeoutSecs) {
      throw new OrchestratorError("orchestrator.bad_request", `timeout must be an integer between 0 and ${this.config.maxTimeoutSecs} seconds, got ${secs}`, { timeout: secs });
    }
    return secs;
  }

  private assertOpen(): void {
    if (this.closed) throw new OrchestratorError("orchestrator.shutting_down", "node is shutting down");
  }
}

/** How the runtime reaches a sandbox's envd. */
function targetOf(r: SandboxRecord): GuestTarget {
  return { id: r.id, endpoint: r.endpoint!, envdAccessToken: r.envdAccessToken };
}

/** The log entry of a state change: what happened in words an SDK user reads, error level for failures. */
export function lifecycleEntry(e: SandboxEvent, error: string | null): SandboxLogEntry {
  const what: Record<string, string> = {
    "null>creating": "sandbox create requested",
    "creating>running": "sandbox created",
    "running>pausing": "sandbox pausing",
    "pausing>paused": "sandbox paused",
    "pausing>running": "sandbox pause undone",
    "paused>resuming": "sandbox resuming",
    "resuming>running": "sandbox resumed",
    "resuming>paused": "sandbox resume failed; it stays paused",
    "killing>killed": "sandbox killed",
  };
  const key = `${e.from}>${e.to}`;
  let message = what[key] ?? (e.to === "killing" ? "sandbox killing" : e.to === "failed" ? `sandbox failed (was ${e.from})` : `sandbox ${e.from} -> ${e.to}`);
  if (error) message += `: ${error}`;
  const level = e.to === "failed" ? "error" : key === "resuming>paused" ? "warn" : "info";
  return { at: e.at, level, source: "lifecycle", message, fields: { from: e.from ?? "", to: e.to } };
}

function templateOf(r: SandboxRecord): TemplateInfo {
  return { templateID: r.templateId, aliases: r.alias ? [r.alias] : [], cpuCount: r.cpuCount, memoryMB: r.memoryMB, diskSizeMB: r.diskSizeMB, envdVersion: r.envdVersion, createdAt: r.createdAt, updatedAt: r.createdAt, buildID: "", buildStatus: "ready" };
}

/** Encode a list cursor as an opaque url-safe token. */
export function encodeCursor(c: ListCursor): string {
  return Buffer.from(`${c.startedAt}:${c.id}`).toString("base64url");
}

/** Decode a list cursor. @throws OrchestratorError bad_request (400) for anything malformed. */
export function decodeCursor(token: string): ListCursor {
  const m = /^(\d{1,16}):([a-z0-9]{1,64})$/.exec(Buffer.from(token, "base64url").toString());
  if (!m) throw new OrchestratorError("orchestrator.bad_request", `invalid nextToken ${JSON.stringify(token)}`, { nextToken: token });
  return { startedAt: Number(m[1]), id: m[2]! };
}
