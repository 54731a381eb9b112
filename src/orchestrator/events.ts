/**
 * Sandbox state changes: each is checked against the state machine (states.ts), stored, written
 * to the sandbox's own log in words an SDK user reads, and published to observers with the
 * node's counters.
 */
import type { Logger } from "pino";
import type { Clock } from "../util/deadline-timer.ts";
import { notFound } from "./errors.ts";
import type { SandboxLogStore } from "./logs.ts";
import type { MetricsHistory } from "./metrics.ts";
import type { OrchestratorObserver, SandboxEvent, SandboxNote, StopReason } from "./service.ts";
import { assertTransition, type SandboxState } from "./states.ts";
import type { SandboxStore } from "./store.ts";
import type { OrchestratorCounters, SandboxLogEntry, SandboxRecord } from "./types.ts";

/** State changes and counters of one orchestrator, with their observers. */
export class SandboxEvents {
  /** running/paused from the store (recount); starting, created, failed, killed counted as they happen. */
  readonly counters: OrchestratorCounters = { running: 0, paused: 0, starting: 0, created: 0, failed: 0, killed: 0 };
  readonly #observers = new Set<OrchestratorObserver>();

  constructor(
    private readonly store: SandboxStore,
    private readonly logs: SandboxLogStore,
    private readonly metrics: MetricsHistory,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {}

  /** Subscribe; returns the unsubscribe function. The observer gets the counters at once. */
  observe(o: OrchestratorObserver): () => void {
    this.#observers.add(o);
    o.onCounters?.({ ...this.counters });
    return () => this.#observers.delete(o);
  }

  /** New sandbox `rec` was stored (state creating). */
  created(rec: SandboxRecord): void {
    this.#emit({ id: rec.id, from: null, to: "creating", at: rec.createdAt, sandbox: rec });
  }

  /**
   * Move sandbox `id` from `from` to `to`, storing `fields` with the new state; `reason`: why a
   * pause or kill happens.
   * @throws OrchestratorError `orchestrator.bad_transition` for an edge the state machine lacks,
   *   `orchestrator.not_found` when the record vanished (a bug: it happens under its own lock)
   */
  transition(id: string, from: SandboxState, to: SandboxState, fields: Partial<SandboxRecord>, reason?: StopReason): void {
    assertTransition(id, from, to);
    const t = this.clock.now();
    const sandbox = this.store.update(id, { ...fields, state: to }, t);
    if (!sandbox) throw notFound(id);
    this.#emit({ id, from, to, at: t, sandbox, ...(reason ? { reason } : {}) }, fields.error ?? null);
  }

  /** A state change stored outside a transition (the start-up reconciliation's). */
  stored(e: SandboxEvent, error: string | null = null): void {
    this.#emit(e, error);
  }

  /** Tell observers of a change that is not a state change (a snapshot, a fork child, a new end time or policy). */
  note(n: SandboxNote): void {
    for (const o of this.#observers) {
      try {
        o.onNote?.(n);
      } catch (err) {
        this.log.error({ err }, "observer failed");
      }
    }
  }

  /** Count running and paused sandboxes from the store again and publish the counters. */
  recount(): void {
    const by = this.store.countByState();
    this.counters.running = (by.running ?? 0) + (by.pausing ?? 0);
    this.counters.paused = by.paused ?? 0;
    for (const o of this.#observers) {
      try {
        o.onCounters?.({ ...this.counters });
      } catch (err) {
        this.log.error({ err }, "observer failed");
      }
    }
  }

  #emit(e: SandboxEvent, error: string | null = null): void {
    this.logs.append(e.id, lifecycleEntry(e, error));
    if (e.to === "killed" || e.to === "failed") this.metrics.drop(e.id);
    for (const o of this.#observers) {
      try {
        o.onEvent?.(e);
      } catch (err) {
        this.log.error({ err }, "observer failed");
      }
    }
  }
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
    "null>paused": "sandbox taken over from the shared snapshot store, paused (its node is gone)",
    "resuming>running": "sandbox resumed",
    "resuming>paused": "sandbox resume failed; it stays paused",
    "killing>killed": "sandbox killed",
  };
  const key = `${e.from}>${e.to}`;
  const lost = e.reason === "vm_lost";
  let message = lost && e.to === "paused" ? "sandbox paused with its files (filesystem only: the next connect boots it on its disk)" : lost && e.to === "pausing" ? "sandbox VM lost" : what[key] ?? (e.to === "killing" ? "sandbox killing" : e.to === "failed" ? `sandbox failed (was ${e.from})` : `sandbox ${e.from} -> ${e.to}`);
  if (error) message += `: ${error}`;
  const level = e.to === "failed" ? "error" : key === "resuming>paused" || lost ? "warn" : "info";
  return { at: e.at, level, source: "lifecycle", message, fields: { from: e.from ?? "", to: e.to } };
}
