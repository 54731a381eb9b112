/**
 * Turns the orchestrator's state changes and notes into E2B lifecycle events (shapes:
 * ../shared/docs/e2b-lifecycle-events.md §2–3) and records each, queued for the webhooks that
 * subscribe to its type. An orchestrator observer: called synchronously after each change is
 * stored, so the event is on disk before the API answers the request that caused it.
 *
 *   creating -> running   created          pausing -> paused   paused {execution, snapshot_kind, pause_reason}
 *   resuming -> running   resumed          * -> killed         killed {execution?, kill_reason}
 *   * -> failed           failed {error}   notes               checkpointed, forked, updated
 *
 * A run (E2B's execution: a create or resume up to the pause, kill or failure that ends it) gets
 * its own `sandboxExecutionId`; runs cut by a node restart, or going on in a sandbox the
 * restarted node adopted (no event marks an adoption), are found again in the store.
 */
import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import type { OrchestratorObserver, SandboxEvent, SandboxNote, SandboxRecord } from "../orchestrator/index.ts";
import type { EventStore } from "./store.ts";
import { EVENT_LABELS, TEAM_ID, type EventType, type ExecutionData, type SandboxLifecycleEvent } from "./types.ts";

/** Where recorded events go besides the store: which webhooks take a type, and who to wake. */
export interface EventSink {
  /** Ids of the enabled webhooks subscribed to `type`. */
  subscribers(type: EventType): string[];
  /** Events were queued for `webhookIds`. */
  queued(webhookIds: readonly string[]): void;
}

interface Run {
  executionId: string;
  startedAt: number;
}

/** A CIDR or an IPv4 address (else an allowOut entry is a domain pattern). */
const CIDR_RE = /^\d{1,3}(\.\d{1,3}){3}(\/\d{1,2})?$/;
const iso = (ms: number) => new Date(ms).toISOString();

export class EventRecorder implements OrchestratorObserver {
  /** The open run of each running sandbox (bounded by the live sandboxes: removed when the run ends). */
  private readonly runs = new Map<string, Run>();

  constructor(
    private readonly store: EventStore,
    private readonly sink: EventSink,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {}

  onEvent(e: SandboxEvent): void {
    const r = e.sandbox;
    if (e.to === "running" && (e.from === "creating" || e.from === "resuming")) {
      const run = { executionId: randomUUID(), startedAt: e.at };
      this.runs.set(e.id, run);
      this.record(e.from === "creating" ? "sandbox.lifecycle.created" : "sandbox.lifecycle.resumed", r, e.at, {}, run.executionId);
    } else if (e.to === "paused" && e.from === "pausing") {
      const end = this.endRun(r, e.at);
      // a VM lost (died, or its disk or slot gone) says why: the error the sandbox was paused with
      const lost = e.reason === "vm_lost" && r.error ? { error: r.error } : {};
      this.record("sandbox.lifecycle.paused", r, e.at, { ...end.data, snapshot_kind: r.snapshotKind ?? "memory", pause_reason: e.reason ?? "request", ...lost }, end.executionId);
    } else if (e.to === "killed") {
      // a kill after a pause or failure ends no run (runOf finds none: the last event ended it);
      // the run of a sandbox a restarted node adopted, or that a restart cut, is found in the store
      const ran = e.from === "killing" || (e.from !== "paused" && e.from !== "failed");
      const end = ran ? this.endRun(r, e.at) : { data: {}, executionId: "" };
      this.record("sandbox.lifecycle.killed", r, e.at, { ...end.data, kill_reason: e.reason ?? "unknown" }, end.executionId);
    } else if (e.to === "failed") {
      const end = this.endRun(r, e.at);
      this.record("sandbox.lifecycle.failed", r, e.at, { ...end.data, error: r.error ?? "unknown error", failed_in: e.from ?? "creating" }, end.executionId);
    }
    if (e.to === "killed" || e.to === "failed") this.runs.delete(e.id);
  }

  onNote(n: SandboxNote): void {
    const r = n.sandbox;
    const run = this.runs.get(n.id)?.executionId ?? "";
    switch (n.kind) {
      case "snapshot":
        this.record("sandbox.lifecycle.checkpointed", r, n.at, { snapshot_id: n.snapshotId, snapshot_names: n.names, purpose: n.purpose }, run);
        return;
      case "forked":
        this.record("sandbox.lifecycle.forked", r, n.at, { source_sandbox_id: n.sourceId }, run);
        return;
      case "timeout":
        this.record("sandbox.lifecycle.updated", r, n.at, { set_timeout: iso(r.endAt) }, run);
        return;
      case "network":
        this.record("sandbox.lifecycle.updated", r, n.at, { network_egress: egressOf(r) }, run);
        return;
    }
  }

  /** The run of `r` that ends now (forgotten here): its id and E2B's `execution`; none when it had none. */
  private endRun(r: SandboxRecord, at: number): { data: { execution?: ExecutionData }; executionId: string } {
    const run = this.runOf(r.id);
    this.runs.delete(r.id);
    if (!run) return { data: {}, executionId: "" };
    const execution = { started_at: iso(run.startedAt), vcpu_count: r.cpuCount, memory_mb: r.memoryMB, execution_time: Math.max(0, at - run.startedAt) };
    return { data: { execution }, executionId: run.executionId };
  }

  /** The open run of `id`: in memory, else (after a node restart) the latest start in the store. */
  private runOf(id: string): Run | undefined {
    const known = this.runs.get(id);
    if (known) return known;
    const start = this.store.last(id, ["sandbox.lifecycle.created", "sandbox.lifecycle.resumed", "sandbox.lifecycle.paused", "sandbox.lifecycle.killed", "sandbox.lifecycle.failed"]);
    if (!start || (start.type !== "sandbox.lifecycle.created" && start.type !== "sandbox.lifecycle.resumed")) return undefined;
    return { executionId: start.sandboxExecutionId, startedAt: Date.parse(start.timestamp) };
  }

  private record(type: EventType, r: SandboxRecord, at: number, data: Record<string, unknown>, executionId: string): void {
    const metadata = Object.keys(r.metadata).length ? { sandbox_metadata: { ...r.metadata } } : {};
    const eventData = { ...metadata, ...data };
    const event: SandboxLifecycleEvent = {
      id: randomUUID(),
      version: "v2",
      type,
      eventCategory: "lifecycle",
      eventLabel: EVENT_LABELS[type],
      eventData: Object.keys(eventData).length ? eventData : null,
      timestamp: iso(at),
      sandboxId: r.id,
      sandboxExecutionId: executionId,
      sandboxTemplateId: r.templateId,
      sandboxBuildId: "",
      sandboxTeamId: TEAM_ID,
    };
    const webhooks = this.sink.subscribers(type);
    try {
      this.store.append(event, webhooks, this.now());
    } catch (err) {
      this.log.error({ err, sandboxId: r.id, type }, "recording a lifecycle event failed");
      return;
    }
    if (webhooks.length) this.sink.queued(webhooks);
  }
}

/** E2B's `network_egress` of `r`'s policy: allowOut split into CIDRs and domains, denyOut. */
function egressOf(r: SandboxRecord): Record<string, unknown> {
  const net = r.network ?? {};
  const list = (v: unknown) => (Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : []);
  const allow = list(net.allowOut);
  return {
    allowed_cidrs: allow.filter((x) => CIDR_RE.test(x)),
    denied_cidrs: list(net.denyOut),
    allowed_domains: allow.filter((x) => !CIDR_RE.test(x)),
    ...(r.allowInternetAccess !== null ? { allow_internet_access: r.allowInternetAccess } : {}),
  };
}
