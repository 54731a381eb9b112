/**
 * The orchestrator: turns API requests into sandbox lifecycle operations on a SandboxRuntime.
 * Owns the state machine (states.ts, with its changes published by events.ts), per-sandbox
 * serialisation (lock.ts), expiry (expiry.ts: kill or pause at endAt), the watch on VMs that end
 * by themselves (exit-watch.ts), and persistence (store.ts, runtime states read back through
 * runtime-state.ts).
 */
import type { Db } from "../db/index.ts";
import { AgentEnvError } from "../errors.ts";
import { asError, errorMessage } from "../util/error.ts";
import { SYSTEM_CLOCK, type Clock } from "../util/deadline-timer.ts";
import type { OrchestratorConfig } from "./config.ts";
import { isRequestFault, notFound, OrchestratorError } from "./errors.ts";
import { SandboxEvents } from "./events.ts";
import { ExitWatch } from "./exit-watch.ts";
import { SandboxExpiry } from "./expiry.ts";
import { newSandboxId, SANDBOX_ID_RE } from "./ids.ts";
import { KeyedLock } from "./lock.ts";
import { MetricsSampler } from "./sampler.ts";
import { SandboxMoves, type ReleaseOutcome } from "./moves.ts";
import { portableRecord } from "./portable.ts";
import { SandboxReads } from "./reads.ts";
import { checkResources, checkTimeout, forkRequest, newRecord, startSpec, targetOf, templateOf } from "./requests.ts";
import type { SandboxRuntime, SnapshotInfo, SnapshotRequest } from "./runtime.ts";
import { keepFilesOfLost, recoverAtStart } from "./recovery.ts";
import { StoredStates } from "./runtime-state.ts";
import { Semaphore } from "./semaphore.ts";
import { FORK_DEFAULT_TIMEOUT_SECS, MAX_FORK_COUNT, type ConnectResult, type ForkResult, type OrchestratorObserver, type SandboxService, type StopReason } from "./service.ts";
import { publicState, type SandboxState } from "./states.ts";
import { INGRESS_FIELDS, type CreateSandboxRequest, type OrchestratorCounters, type SandboxRecord, type TemplateInfo } from "./types.ts";
import { VolumeManager } from "./volumes.ts";

/** What `Orchestrator.close()` did with the live sandboxes. */
export interface ShutdownSummary {
  killed: number;
  paused: number;
  /** Left running for the next node to adopt (`shutdown_action = "detach"`). */
  detached: number;
  /** Sandboxes whose kill or pause threw (logged individually). */
  failed: number;
}

/**
 * The sandbox lifecycle over runtime `runtime`, whose per-sandbox state is `S` (persisted as
 * JSON, read back through `runtime.state`). `clock` gives record times, deadlines and the expiry
 * timer (tests move it on).
 */
export class Orchestrator<S = unknown> extends SandboxReads<S> implements SandboxService {
  /** Volumes and who holds them. */
  readonly volumes: VolumeManager;
  /** The expiry timer (armed at the earliest deadline of the running sandboxes). */
  readonly expiry: SandboxExpiry;
  private readonly events: SandboxEvents;
  private readonly states: StoredStates<S>;
  private readonly exits: ExitWatch;
  private readonly sampler: MetricsSampler;
  /** Sandboxes taken over from, or let go to, other nodes (moves.ts). */
  private readonly moves: SandboxMoves<S>;
  private readonly lock: KeyedLock;
  private readonly starts: Semaphore;
  private readonly inflight = new Set<Promise<unknown>>();
  private readonly shutdown = new AbortController();
  private closed = false;

  constructor(
    db: Db,
    runtime: SandboxRuntime<S>,
    config: OrchestratorConfig,
    private readonly clock: Clock = SYSTEM_CLOCK,
  ) {
    super(db, runtime, config);
    const now = () => clock.now();
    this.lock = new KeyedLock(config.lockWaitMs, config.lockMaxWaiters);
    this.starts = new Semaphore(config.maxConcurrentStarts);
    this.events = new SandboxEvents(this.store, this.logs, this.metricsHistory, clock, this.log);
    this.states = new StoredStates(runtime.state, this.log);
    this.exits = new ExitWatch((id, why, current) => this.failEnded(id, why, current));
    this.expiry = new SandboxExpiry(this.store, clock, (s) => this.track(s.autoPause ? this.pauseNow(s.id, s.autoPauseMemory, "timeout") : this.killNow(s.id, false, "timeout")), this.log);
    // every state change may move the earliest deadline
    this.events.observe({ onEvent: () => this.expiry.changed() });
    // a sandbox that ended is watched no more
    this.events.observe({ onEvent: (e) => (e.to === "killed" || e.to === "failed" ? this.sampler.forget(e.id) : undefined) });
    const backend = runtime.volumes;
    const live: SandboxState[] = ["creating", "running", "pausing", "paused", "resuming", "killing"];
    this.volumes = new VolumeManager(db, backend, { ...config.volumes, lockWaitMs: config.lockWaitMs }, () => this.store.inStates(live), backend ? (holder, mount) => backend.guestFiles(targetOf(holder), mount.path) : undefined, now);
    const running = () => this.store.inStates(["running"]).filter((r) => r.endpoint).map(targetOf);
    this.sampler = new MetricsSampler(runtime.metrics, this.metricsHistory, running, {
        intervalMs: config.metrics.sampleIntervalMs,
        watchMs: config.metrics.watchMs,
        idleIntervalMs: config.metrics.idleSampleIntervalMs,
        timeoutMs: config.metrics.sampleTimeoutMs,
        maxConcurrent: config.metrics.maxConcurrentSamples,
      }, now, this.log);
    this.moves = new SandboxMoves({
      runtime,
      store: this.store,
      events: this.events,
      states: this.states,
      lock: this.lock,
      clock,
      log: this.log,
      kill: (id) => this.track(this.killNow(id, false, "moved")),
      snapshot: (id, name) => this.createSnapshot(id, name),
    });
  }

  /**
   * Reconcile with what a previous node left (recovery.ts): sandboxes whose VM still runs are
   * adopted and run on, those whose VM died keep their files as a paused sandbox, the rest are
   * recorded killed; paused ones stay paused. Then arm the expiry timer (a deadline that passed
   * while no node ran fires at once) and start sampling.
   */
  async start(): Promise<void> {
    const t0 = performance.now();
    const s = await recoverAtStart({ store: this.store, events: this.events, exits: this.exits, runtime: this.runtime, states: this.states, logs: this.logs, clock: this.clock, log: this.log });
    const t = this.clock.now();
    this.log.info(
      { adopted: s.adopted, pausedWithFiles: s.paused, killed: s.killed, paused: s.stayedPaused, stoppedVms: s.report.stoppedVms.length, removed: s.report.removed.length, ms: Math.round(performance.now() - t0), ...s.report.timings },
      "start-up reconciliation done",
    );
    this.store.prune(t - this.config.killedRetentionSecs * 1000);
    this.logs.pruneOrphans();
    this.logs.start();
    this.events.recount();
    this.expiry.start();
    this.sampler.start();
  }

  /**
   * Disarm the expiry timer, wait for operations in flight, then kill, pause or leave running
   * (per `shutdown_action`) every live sandbox, log one summary line, and close (or, with
   * "detach", detach) the runtime. "detach" on a runtime that cannot leave sandboxes running
   * kills them.
   * @returns how many sandboxes were killed, paused, left running, or failed to stop (all 0 on a second call).
   */
  async close(): Promise<ShutdownSummary> {
    const summary: ShutdownSummary = { killed: 0, paused: 0, detached: 0, failed: 0 };
    if (this.closed) return summary;
    this.closed = true;
    await this.expiry.stop();
    await this.sampler.stop();
    this.runtime.beginShutdown();
    this.shutdown.abort(new OrchestratorError("orchestrator.shutting_down", "node is shutting down"));
    await Promise.allSettled([...this.inflight]);
    const detach = this.config.shutdownAction === "detach" && this.runtime.detach !== undefined;
    if (this.config.shutdownAction === "detach" && !detach) this.log.warn({ runtime: this.runtime.name }, "shutdown_action detach: this runtime cannot leave sandboxes running; they are killed");
    const live = this.store.inStates(["running", "creating", "resuming", "pausing"]);
    const results = await Promise.allSettled(
      live.map(async (r) => {
        if (detach && r.state === "running") return "detached" as const;
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
    const left = summary.detached ? `, left ${summary.detached} running for the next start` : "";
    this.log.info(summary, `shutdown: killed ${summary.killed}, paused ${summary.paused} sandboxes${left}${summary.failed ? `, ${summary.failed} failed to stop` : ""}`);
    if (detach) await this.runtime.detach!();
    else await this.runtime.close();
    this.logs.close();
    return summary;
  }

  /** Subscribe; returns the unsubscribe function. The observer gets the counters at once. */
  observe(o: OrchestratorObserver): () => void {
    return this.events.observe(o);
  }

  /** A copy of the current counters. */
  getCounters(): OrchestratorCounters {
    return { ...this.events.counters };
  }

  /**
   * Create and boot a sandbox; resolves once envd is initialised.
   * @throws OrchestratorError template_not_found (404), bad_request (400), capacity (429),
   *   create_failed (500), shutting_down (503).
   */
  async create(req: CreateSandboxRequest): Promise<SandboxRecord> {
    this.assertOpen();
    const timeoutSecs = checkTimeout(this.config, req.timeoutSecs ?? this.config.defaultTimeoutSecs);
    if (req.autoPauseMemory === false && req.autoResume === true) {
      // E2B: traffic must not cold-boot a sandbox, so a filesystem-only auto-pause excludes autoResume
      throw new OrchestratorError("orchestrator.bad_request", "autoPauseMemory: false cannot be combined with autoResume: a filesystem-only snapshot is resumed explicitly (connect), never by traffic", {
        autoPauseMemory: false,
        autoResume: true,
      });
    }
    await this.runtime.network?.check(req.network ?? null, req.allowInternetAccess ?? null);
    // checked now for a prompt 400/409, and again just before the record is inserted (holders may change meanwhile)
    this.volumes.resolveMounts(req.volumeMounts ?? []);
    const tpl = await this.runtime.resolveTemplate(req.template);
    if (!tpl) throw new OrchestratorError("orchestrator.template_not_found", `template '${req.template}' not found`, { template: req.template });
    return this.createWith(req, tpl, timeoutSecs, { templateId: tpl.templateID, alias: tpl.aliases.includes(req.template) ? req.template : (tpl.aliases[0] ?? null) });
  }

  /**
   * Create a sandbox started from `tpl` (a template, or a snapshot seen as one), recorded as
   * `shown`. Its id is one the runtime prepared a start for (`runtime.prepared`), when it has one.
   */
  private async createWith(req: CreateSandboxRequest, tpl: TemplateInfo, timeoutSecs: number, shown: { templateId: string; alias: string | null }): Promise<SandboxRecord> {
    const { cpuCount, memoryMB } = checkResources(this.config, req.cpuCount ?? tpl.cpuCount, req.memoryMB ?? tpl.memoryMB, req.cpuCount !== undefined || req.memoryMB !== undefined);
    this.assertCapacity();
    const volumeMounts = this.volumes.resolveMounts(req.volumeMounts ?? []);
    const prepared = await this.runtime.prepared?.claim(tpl, { cpuCount, memoryMB, volumes: volumeMounts.length }).catch((e) => {
      this.log.warn({ template: tpl.templateID, err: e }, "no prepared sandbox claimed");
      return null;
    });
    // checked again: other creates may have started while the claim was looked up (a claimed
    // start not used lapses in the runtime)
    this.assertCapacity();
    const id = prepared && SANDBOX_ID_RE.test(prepared) && !this.store.get(prepared) ? prepared : newSandboxId();
    const rec = newRecord(req, tpl, { id, shown, cpuCount, memoryMB, volumeMounts, timeoutSecs, now: this.clock.now() });
    this.store.insert(rec);
    this.events.counters.starting++;
    this.events.created(rec);
    return this.track(
      this.lock.run(id, async () => {
        try {
          const started = await this.withStartSlot(this.config.createTimeoutMs, async (signal) => {
            if (rec.volumeMounts.length > 0) await this.volumes.prepareAttach(rec);
            return this.runtime.start(this.startSpec(rec, tpl, signal));
          });
          const now = this.clock.now();
          this.events.transition(id, "creating", "running", {
            endpoint: started.endpoint,
            runtimeState: started.runtimeState,
            envdVersion: started.envdVersion,
            startedAt: now,
            endAt: now + timeoutSecs * 1000,
          });
          this.events.counters.created++;
          this.store.recordSpawn(shown.templateId, now);
          this.exits.watch(id, started);
          return this.store.get(id)!;
        } catch (e) {
          this.events.counters.failed++;
          this.events.transition(id, "creating", "failed", { error: errorMessage(e) });
          this.log.error({ sandboxId: id, err: e }, "create failed");
          if (isRequestFault(e)) throw e;
          throw new OrchestratorError("orchestrator.create_failed", `failed to create sandbox: ${errorMessage(e)}`, { sandboxId: id, template: tpl.templateID }, { cause: e });
        } finally {
          this.events.counters.starting--;
          this.events.recount();
        }
      }),
    );
  }

  /** @throws OrchestratorError capacity (429) when the node runs as many sandboxes as it may. */
  private assertCapacity(): void {
    const c = this.events.counters;
    if (c.running + c.starting >= this.config.maxSandboxes) {
      throw new OrchestratorError("orchestrator.capacity", `node is at its limit of ${this.config.maxSandboxes} concurrent sandboxes`, { limit: this.config.maxSandboxes });
    }
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
    const timeoutSecs = checkTimeout(this.config, opts.timeoutSecs ?? FORK_DEFAULT_TIMEOUT_SECS);
    this.get(id);
    const snap = await this.track(this.lock.run(id, () => this.snapshotLocked(id, { kind: "fork" })));
    const parent = this.store.get(id)!;
    try {
      const tpl = await this.runtime.resolveTemplate(snap.snapshotID);
      if (!tpl) throw new OrchestratorError("orchestrator.runtime_failed", `fork checkpoint ${snap.snapshotID} of ${id} vanished`, { sandboxId: id });
      const req = forkRequest(parent, snap.snapshotID, timeoutSecs);
      const results = await Promise.allSettled(
        Array.from({ length: count }, async () => {
          this.assertOpen();
          const child = await this.createWith(req, tpl, timeoutSecs, { templateId: parent.templateId, alias: parent.alias });
          this.events.note({ kind: "forked", id: child.id, at: this.clock.now(), sandbox: child, sourceId: id });
          return child;
        }),
      );
      return results.map((x) => (x.status === "fulfilled" ? { sandbox: x.value } : { error: asError(x.reason) }));
    } finally {
      await this.runtime.snapshots?.delete(snap.snapshotID).catch((e) => this.log.error({ sandboxId: id, err: e }, "dropping the fork checkpoint failed"));
    }
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
      const snap = await snapshots.take(id, this.states.of(r), { ...req, volumes: r.volumeMounts.length }, AbortSignal.any([AbortSignal.timeout(this.config.pauseTimeoutMs), this.shutdown.signal]));
      this.events.note({ kind: "snapshot", id, at: this.clock.now(), sandbox: this.store.get(id)!, snapshotId: snap.snapshotID, names: snap.names, purpose: req.kind === "fork" ? "fork" : "user" });
      return snap;
    } catch (e) {
      if (isRequestFault(e)) throw e;
      const code = e instanceof AgentEnvError ? `[${e.code}] ` : "";
      throw new OrchestratorError("orchestrator.runtime_failed", `failed to snapshot sandbox ${id}: ${code}${errorMessage(e)}`, { sandboxId: id, cause: e instanceof AgentEnvError ? e.code : null }, { cause: e });
    }
  }

  /**
   * Someone reads the metrics of `ids` (sampler.ts): with `keep` they are sampled every
   * `[metrics] sample_interval_ms` for `watch_ms`; running ones without a current sample get one
   * before this resolves (at most `sample_timeout_ms` later). Unknown ids are ignored.
   */
  watchMetrics(ids: readonly string[], keep: boolean): Promise<void> {
    return this.sampler.watch(ids, keep);
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
   * `fromStore`: take a sandbox that is not here over from the shared snapshot store first (its
   * node is gone; the gateway sends this after the scheduler moved the sandbox here).
   * @throws not_found (404), bad_request (400, timeout out of range).
   */
  async connect(id: string, timeoutSecs?: number, opts: { memory?: boolean; fromStore?: boolean } = {}): Promise<ConnectResult> {
    if (opts.fromStore) await this.takeOver(id);
    return this.underLockWithTimeout(id, timeoutSecs, async (r, secs) => {
      if (r.state === "paused") return { sandbox: await this.resumeLocked(r, secs, opts.memory ?? true), resumed: true };
      this.setEndAt(r, Math.max(r.endAt, this.clock.now() + secs * 1000));
      return { sandbox: this.store.get(id)!, resumed: false };
    });
  }

  /** Deprecated E2B resume: 409 when running; `memory: false`, `fromStore` as for connect. @throws not_found (404), conflict (409). */
  async resume(id: string, timeoutSecs?: number, opts: { memory?: boolean; fromStore?: boolean } = {}): Promise<SandboxRecord> {
    if (opts.fromStore) await this.takeOver(id);
    return this.underLockWithTimeout(id, timeoutSecs, (r, secs) => {
      if (r.state !== "paused") throw new OrchestratorError("orchestrator.conflict", `sandbox ${id} is already running`, { sandboxId: id, state: r.state });
      return this.resumeLocked(r, secs, opts.memory ?? true);
    });
  }

  /** Take paused sandbox `id` over from the shared snapshot store unless it is here (moves.ts). */
  private async takeOver(id: string): Promise<void> {
    this.assertOpen();
    await this.track(this.moves.takeOver(id));
  }

  /**
   * Another node holds sandbox `id` now (the scheduler said so in a heartbeat answer): drop this
   * node's copy without losing data (moves.ts). Never throws.
   */
  release(id: string): Promise<ReleaseOutcome> {
    if (this.closed) return Promise.resolve({ kind: "refused", reason: "node is shutting down" });
    return this.track(this.moves.release(id));
  }

  /**
   * The checks of connect and resume (node open, timeout in range, `id` live; thrown at the call),
   * then `fn` with the record as it is under the sandbox's lock and the timeout in seconds.
   */
  private underLockWithTimeout<T>(id: string, timeoutSecs: number | undefined, fn: (r: SandboxRecord, secs: number) => Promise<T>): Promise<T> {
    this.assertOpen();
    const secs = checkTimeout(this.config, timeoutSecs ?? this.config.defaultTimeoutSecs);
    this.get(id);
    return this.track(this.lock.run(id, () => fn(this.get(id), secs)));
  }

  /** Set endAt = now + `secs` (may shorten). @throws not_found (404), bad_request (400). */
  setTimeout(id: string, secs: number): Promise<void> {
    checkTimeout(this.config, secs);
    this.get(id);
    return this.lock.run(id, async () => {
      this.setEndAt(this.get(id), this.clock.now() + secs * 1000);
    });
  }

  /** Keep alive for `secs` more: endAt = max(endAt, now + secs). @throws not_found (404). */
  refresh(id: string, secs: number): Promise<void> {
    this.get(id);
    return this.lock.run(id, async () => {
      const r = this.get(id);
      this.setEndAt(r, Math.max(r.endAt, this.clock.now() + secs * 1000));
    });
  }

  /** Store a new end time of `r` and arm the expiry timer for it; observers hear of it when it changed. */
  private setEndAt(r: SandboxRecord, endAt: number): void {
    const sandbox = this.store.update(r.id, { endAt }, this.clock.now())!;
    this.expiry.changed();
    if (endAt !== r.endAt) this.events.note({ kind: "timeout", id: r.id, at: this.clock.now(), sandbox });
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
      // ingress settings are made at create and stay (E2B: the PUT replaces the egress part only)
      const ingress = Object.fromEntries(Object.entries(r.network ?? {}).filter(([k]) => (INGRESS_FIELDS as readonly string[]).includes(k)));
      const sandbox = this.store.update(id, { network: { ...ingress, ...policy }, allowInternetAccess: typeof flag === "boolean" ? flag : null }, this.clock.now())!;
      this.events.note({ kind: "network", id, at: this.clock.now(), sandbox });
    });
  }

  // ---- internals ----

  private async killNow(id: string, force: boolean, reason: StopReason): Promise<void> {
    await this.lock.run(id, async () => {
      const r = this.store.get(id);
      if (!r || (publicState(r.state) === null && !(force && r.state === "failed"))) throw notFound(id);
      this.exits.forget(id);
      const wasRunning = r.state === "running" && r.endpoint !== null;
      this.events.transition(id, r.state, "killing", {}, reason);
      if (wasRunning && r.volumeMounts.some((m) => !m.readOnly)) {
        // the volume outlives the sandbox: flush and unmount it in the guest before the VM dies
        await this.runtime
          .quiesce(targetOf(r), r.volumeMounts, this.config.volumes.detachTimeoutMs)
          .catch((e) => this.log.warn({ sandboxId: id, err: e }, "could not unmount the volumes in the guest before the kill; their journals will be replayed"));
      }
      try {
        await this.runtime.kill(id, this.states.forKill(r));
      } catch (e) {
        this.events.transition(id, "killing", "failed", { error: `kill failed: ${errorMessage(e)}` });
        throw new OrchestratorError("orchestrator.runtime_failed", `failed to kill sandbox ${id}: ${errorMessage(e)}`, { sandboxId: id }, { cause: e });
      }
      this.events.transition(id, "killing", "killed", { endpoint: null, runtimeState: null }, reason);
      this.events.counters.killed++;
      this.events.recount();
    });
  }

  private async pauseNow(id: string, memory: boolean, reason: StopReason): Promise<void> {
    await this.lock.run(id, async () => {
      const r = this.get(id);
      if (r.state === "paused") throw new OrchestratorError("orchestrator.conflict", `sandbox ${id} is already paused`, { sandboxId: id });
      const ends = this.exits.forget(id);
      this.events.transition(id, "running", "pausing", {}, reason);
      const signal = AbortSignal.timeout(this.config.pauseTimeoutMs);
      try {
        if (!memory && r.endpoint) {
          // only the disk is kept: flush the guest's filesystems and unmount its volumes first
          await this.runtime.quiesce(targetOf(r), r.volumeMounts, this.config.volumes.detachTimeoutMs).catch((e) => {
            this.log.warn({ sandboxId: id, err: e }, "could not flush the guest before a filesystem-only pause; writes not yet on disk are lost");
          });
        }
        const st = await this.runtime.pause(id, this.states.of(r), signal, { memory, record: portableRecord(r, memory) });
        this.events.transition(id, "pausing", "paused", { runtimeState: st, endpoint: null, snapshotKind: memory ? "memory" : "filesystem" }, reason);
      } catch (e) {
        const error = `pause failed: ${errorMessage(e)}`;
        if (ends) {
          // the runtime leaves the VM running when a pause fails before the VMM is stopped: the
          // sandbox runs on. A VMM that died meanwhile (or was stopped before the commit failed)
          // ends the watch at once, and its sandbox is paused with its files (failEnded), never
          // killed: a pause cut by a VM loss must not lose the files
          this.log.warn({ sandboxId: id, err: e }, `${error}; the sandbox runs on (paused with its files if its VM is gone)`);
          this.events.transition(id, "pausing", "running", {});
          this.exits.watch(id, ends);
        } else {
          // no end of its VM to watch: whether it runs on is unknown
          this.events.transition(id, "pausing", "failed", { error });
          await this.runtime.kill(id, this.states.forKill(r)).catch(() => {});
        }
        this.events.recount();
        throw new OrchestratorError("orchestrator.runtime_failed", `failed to pause sandbox ${id}: ${errorMessage(e)}`, { sandboxId: id }, { cause: e });
      }
      this.events.recount();
    });
  }

  /** Resume paused `r`: restore its memory snapshot, or cold-boot it on its disk (filesystem-only snapshot, or `memory` false). */
  private async resumeLocked(r: SandboxRecord, secs: number, memory: boolean): Promise<SandboxRecord> {
    const tpl = (await this.runtime.listTemplates()).find((t) => t.templateID === r.templateId);
    const coldBoot = r.snapshotKind === "filesystem" || !memory;
    this.events.transition(r.id, "paused", "resuming", {});
    this.events.counters.starting++;
    try {
      const started = await this.withStartSlot(this.config.createTimeoutMs, (signal) => this.runtime.resume(this.startSpec(r, tpl ?? templateOf(r), signal), this.states.of(r), { memory: !coldBoot }));
      const now = this.clock.now();
      this.events.transition(r.id, "resuming", "running", {
        endpoint: started.endpoint,
        runtimeState: started.runtimeState,
        envdVersion: started.envdVersion,
        endAt: now + secs * 1000,
        snapshotKind: null,
      });
      if (coldBoot) this.logs.append(r.id, { at: now, level: "info", source: "lifecycle", message: "sandbox cold-booted on its disk (no memory restored)", fields: {} });
      this.exits.watch(r.id, started);
      return this.store.get(r.id)!;
    } catch (e) {
      this.events.transition(r.id, "resuming", "paused", { error: `resume failed: ${errorMessage(e)}` });
      throw new OrchestratorError("orchestrator.runtime_failed", `failed to resume sandbox ${r.id}: ${errorMessage(e)}`, { sandboxId: r.id }, { cause: e });
    } finally {
      this.events.counters.starting--;
      this.events.recount();
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

  private startSpec(r: SandboxRecord, template: TemplateInfo, signal: AbortSignal) {
    return startSpec(r, template, signal, (line) => this.logs.append(r.id, { ...line, fields: line.fields ?? {} }));
  }

  /**
   * Running sandbox `id`'s VM ended by itself, or the runtime reports it lost (its disk device
   * removed): it is paused with its files, or failed when they cannot be kept (recovery.ts
   * `keepFilesOfLost`), unless a newer start (or a pause or kill) took its place meanwhile.
   */
  private failEnded(id: string, why: string, current: () => boolean): void {
    if (this.closed) return;
    void this.lock
      .run(id, async () => {
        const r = this.store.get(id);
        if (!r || r.state !== "running" || !current()) return;
        this.exits.forget(id);
        await keepFilesOfLost({ store: this.store, events: this.events, runtime: this.runtime, states: this.states, log: this.log }, r, why);
        this.events.recount();
      })
      .catch((e) => this.log.error({ sandboxId: id, err: e }, "exit watcher failed"));
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.inflight.add(p);
    void p.then(
      () => this.inflight.delete(p),
      () => this.inflight.delete(p),
    );
    return p;
  }

  private assertOpen(): void {
    if (this.closed) throw new OrchestratorError("orchestrator.shutting_down", "node is shutting down");
  }
}
