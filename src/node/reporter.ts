/**
 * Scheduler reporting (seeds: Observability Data Flow): every `interval_secs` a Heartbeat with
 * the node snapshot (identity, machine, host figures, counters, the full sandbox roster); on
 * sandbox lifecycle changes a ReportSandboxEvent (batched: sent `event_flush_ms` after the first
 * queued one, at most `event_batch_max` per call, further calls at once until none is left), so
 * bindings follow at once; on shutdown a best-effort UnregisterNode after any heartbeat or event
 * call in flight has ended (a late event must not bind a sandbox again after the unregister).
 * Every RPC is bounded by `timeout_ms`; a scheduler that is down is logged (once per outage) and
 * retried at the next tick, never awaited by requests. The first heartbeat goes at `start()`,
 * which the node calls once its start-up reconciliation is done: a restarted node's first roster
 * names every sandbox it still holds (running and paused), so the scheduler keeps their bindings
 * and drops the others. A heartbeat's answer may name sandboxes of the roster that another node
 * holds now (moved while this node was away): `onForeign` gets them, to drop this node's copies.
 */
import { CpuMeter } from "../ffi/cpu.ts";
import { createClient, type Channel } from "nice-grpc";
import type { Logger } from "pino";
import { CHANNEL_RETRY_MS, NodeStatus, SandboxEventType, SchedulerDefinition, schedulerChannel, untilAnswered, type HeartbeatRequest, type SandboxEvent, type SchedulerClient } from "../cluster/index.ts";
import { logger } from "../observability/log.ts";
import { nodeSnapshot, type NodeIdentityInfo, type SnapshotSource } from "../observability/snapshot.ts";

/** Settings of the reporter (`[observability.scheduler_report]`, `[cluster] scheduler_endpoint`). */
export interface ReporterOptions {
  /** Scheduler address: host:port or http://host:port. */
  endpoint: string;
  /** Between heartbeats, ms. */
  intervalMs: number;
  /** Bound on one RPC, ms. */
  timeoutMs: number;
  /** Delay from the first queued lifecycle event to its ReportSandboxEvent call, ms. */
  eventFlushMs: number;
  /** Most events in one ReportSandboxEvent call. */
  eventBatchMax: number;
  /**
   * Tell the scheduler at `close()` to keep this node's bindings (UnregisterNode keep_bindings):
   * its sandboxes outlive the process (paused, or left running for the next start).
   */
  keepBindings?: boolean;
  /** Sandboxes of this node's roster another node holds now (from a heartbeat's answer); must not throw. */
  onForeign?: (sandboxIds: string[]) => void;
}

/** A lifecycle change to report: the orchestrator's state change. */
export interface LifecycleChange {
  id: string;
  from: string | null;
  to: string;
  cpuCount?: number;
  memoryMB?: number;
}

/** Event type of a state change, or null when the scheduler need not hear of it. */
export function eventTypeOf(c: LifecycleChange): SandboxEventType | null {
  if (c.to === "running") return c.from === "resuming" ? SandboxEventType.SANDBOX_EVENT_TYPE_RESUME : SandboxEventType.SANDBOX_EVENT_TYPE_CREATE;
  if (c.to === "paused") return SandboxEventType.SANDBOX_EVENT_TYPE_PAUSE;
  if (c.to === "killed" || c.to === "failed") return SandboxEventType.SANDBOX_EVENT_TYPE_DELETE;
  return null;
}

/**
 * Reports one node to the scheduler: `start()` begins heartbeats, `noteChange()` queues
 * lifecycle events, `close()` stops and unregisters. Never throws at its callers: failures are
 * logged and the next heartbeat carries the truth again.
 */
export class SchedulerReporter {
  private readonly log: Logger = logger("reporter");
  private readonly cpu = new CpuMeter();
  private readonly channel: Channel;
  private readonly client: SchedulerClient;
  private timer: ReturnType<typeof setInterval> | undefined;
  private inflight: Promise<void> | undefined;
  private pending: SandboxEvent[] = [];
  private flushTimer: ReturnType<typeof setTimeout> | undefined;
  /** The event sending in progress (close() waits for it). */
  private flushing: Promise<void> | undefined;
  private failing = false;
  private closed = false;

  constructor(private readonly identity: NodeIdentityInfo, private readonly source: SnapshotSource, private readonly o: ReporterOptions) {
    this.channel = schedulerChannel(o.endpoint);
    this.client = createClient(SchedulerDefinition, this.channel);
  }

  /** Send the first heartbeat now (not awaited), then every interval. */
  start(): void {
    this.tick();
    this.timer = setInterval(() => this.tick(), this.o.intervalMs);
  }

  /** Queue a lifecycle change; sent eventFlushMs later together with the others queued by then. */
  noteChange(c: LifecycleChange): void {
    const type = eventTypeOf(c);
    if (type === null || this.closed) return;
    this.pending.push({ sandboxId: c.id, eventType: type, requestedCpu: c.cpuCount ?? 0, requestedMemoryBytes: (c.memoryMB ?? 0) * 1024 * 1024, requestedDiskBytes: 0 });
    this.armFlush();
  }

  /** Schedule a flush unless one is scheduled or running (a running one takes what is queued meanwhile; whatever is left after it gets a new one). */
  private armFlush(): void {
    if (this.flushing || this.flushTimer || this.closed || this.pending.length === 0) return;
    this.flushTimer = setTimeout(() => {
      this.flushTimer = undefined;
      this.flushing = this.flush().finally(() => {
        this.flushing = undefined;
        this.armFlush();
      });
    }, this.o.eventFlushMs);
  }

  /** Send queued events, eventBatchMax per call, until none is left (or the reporter closes). */
  private async flush(): Promise<void> {
    while (this.pending.length > 0 && !this.closed) {
      const events = this.pending.splice(0, this.o.eventBatchMax);
      try {
        await this.client.reportSandboxEvent({ nodeId: this.identity.nodeId, clusterId: this.identity.clusterId, serviceInstanceId: this.identity.serviceInstanceId, events }, { signal: AbortSignal.timeout(this.o.timeoutMs) });
      } catch (e) {
        // the next heartbeat's roster carries the same truth
        this.log.debug({ err: e, events: events.length }, "sandbox events not delivered");
      }
    }
  }

  /** Build the HeartbeatRequest from a fresh snapshot. */
  async heartbeatRequest(): Promise<HeartbeatRequest> {
    const s = await nodeSnapshot(this.identity, this.source, this.cpu);
    return {
      nodeId: s.identity.nodeId,
      clusterId: s.identity.clusterId,
      serviceInstanceId: s.identity.serviceInstanceId,
      version: s.version,
      commit: s.commit,
      machineInfo: { ...s.machine, cpuConfigJson: "" },
      snapshot: {
        status: NodeStatus.NODE_STATUS_READY,
        allocatedCpu: s.allocatedCpu,
        allocatedMemoryBytes: s.allocatedMemoryBytes,
        cpuPercent: s.cpuPercent,
        cpuCount: s.cpuCount,
        memoryUsedBytes: s.memoryUsedBytes,
        memoryTotalBytes: s.memoryTotalBytes,
        disks: s.disks,
        sandboxCount: s.sandboxCount,
        sandboxStartingCount: s.startingCount,
        createSuccesses: s.createSuccesses,
        createFails: s.createFails,
        reportedAtUnixMs: s.takenAt,
        pausedSandboxCount: s.pausedCount,
        pausedAllocatedCpu: s.pausedAllocatedCpu,
        pausedAllocatedMemoryBytes: s.pausedAllocatedMemoryBytes,
      },
      sandboxIds: s.roster,
      p2pEndpoint: undefined,
    };
  }

  private tick(): void {
    if (this.inflight || this.closed) return; // a slow scheduler: never more than one heartbeat in flight
    this.inflight = this.beat().finally(() => (this.inflight = undefined));
  }

  private async beat(): Promise<void> {
    try {
      const req = await this.heartbeatRequest();
      const res = await this.client.heartbeat(req, { signal: AbortSignal.timeout(this.o.timeoutMs) });
      if (this.failing) this.log.info({ endpoint: this.o.endpoint }, "scheduler reachable again");
      this.failing = false;
      if (res.foreignSandboxIds.length > 0 && !this.closed) {
        this.log.warn({ sandboxIds: res.foreignSandboxIds }, "the scheduler binds sandboxes of this node to another node that holds them now");
        this.o.onForeign?.(res.foreignSandboxIds);
      }
    } catch (e) {
      if (!this.failing) this.log.warn({ endpoint: this.o.endpoint, err: e }, "heartbeat to the scheduler failed; retrying every interval");
      this.failing = true;
    }
  }

  /**
   * Stop reporting, wait for the heartbeat and event call in flight, then tell the scheduler this
   * node leaves (best effort, bounded). Events still queued are dropped: the unregister drops
   * every binding of the node anyway, or keeps them all (`keepBindings`) for the next start's roster.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    clearTimeout(this.flushTimer);
    this.pending = [];
    await this.inflight;
    await this.flushing;
    try {
      // a channel backing off after a scheduler restart would fail the one call at once
      const signal = AbortSignal.timeout(this.o.timeoutMs);
      await untilAnswered(() => this.client.unregisterNode({ nodeId: this.identity.nodeId, serviceInstanceId: this.identity.serviceInstanceId, keepBindings: this.o.keepBindings ?? false }, { signal }), signal, CHANNEL_RETRY_MS);
    } catch (e) {
      this.log.warn({ endpoint: this.o.endpoint, err: e }, "UnregisterNode failed (the scheduler drops this node when its reports stop)");
    }
    this.channel.close();
  }
}
