/**
 * What becomes of sandboxes when the node that ran them is gone (issue 27): at start-up, each
 * sandbox the database says was alive is adopted (its VM runs on under this node), paused with
 * its files (its VM died or lost its disk export or slot while no node watched), or recorded
 * killed when nothing of it could be kept; and while the node runs, a sandbox whose VM ends by
 * itself is paused with its files the same way instead of failed. Adopted sandboxes keep their
 * run: no lifecycle event is recorded for them (the run their `created` or `resumed` event began
 * goes on).
 */
import type { Logger } from "pino";
import type { Clock } from "../util/deadline-timer.ts";
import { errorMessage } from "../util/error.ts";
import type { SandboxEvents } from "./events.ts";
import type { ExitWatch } from "./exit-watch.ts";
import type { SandboxLogStore } from "./logs.ts";
import type { ReapReport, RecoveredSandbox, RuntimeSandbox, SandboxRuntime } from "./runtime.ts";
import type { StoredStates } from "./runtime-state.ts";
import type { SandboxState } from "./states.ts";
import type { SandboxStore } from "./store.ts";
import type { SandboxLogLine, SandboxRecord } from "./types.ts";

/** States a start-up finds sandboxes in that it must settle (everything but killed). */
export const LEFT_STATES: readonly SandboxState[] = ["creating", "running", "pausing", "resuming", "killing", "failed", "paused"];

/** What start-up recovery works with: the orchestrator's parts. */
export interface RecoveryDeps<S> {
  store: SandboxStore;
  events: SandboxEvents;
  exits: ExitWatch;
  runtime: SandboxRuntime<S>;
  states: StoredStates<S>;
  logs: SandboxLogStore;
  clock: Clock;
  log: Logger;
}

/** What start-up recovery did, counted per outcome, with the runtime's report. */
export interface RecoverySummary<S> {
  adopted: number;
  /** Paused with their files (VM lost) or back to paused (a resume cut by the restart). */
  paused: number;
  /** Recorded killed: nothing of them could be kept, or they were being created or killed. */
  killed: number;
  /** Paused before the restart and still paused. */
  stayedPaused: number;
  report: ReapReport<S>;
}

/**
 * Settle every sandbox a previous node left (see the module comment): the runtime recovers what
 * it can (`SandboxRuntime.recover`), then each record moves to what its sandbox now is.
 * - running or pausing, adopted: it runs on (a pausing one's pause is undone: `pausing -> running`);
 * - running or pausing, VM lost, files kept: `-> pausing -> paused` (reason `vm_lost`, its error why);
 * - resuming: back to paused (its pause snapshot is whole; the VM the resume started is gone);
 * - creating, killing, failed, or nothing kept: killed (reason `orphaned`), as before adoption.
 */
export async function recoverAtStart<S>(d: RecoveryDeps<S>): Promise<RecoverySummary<S>> {
  const left = d.store.inStates(LEFT_STATES);
  const keepable = (r: SandboxRecord) => r.state === "running" || r.state === "pausing";
  const known = left.map((r) => ({
    ...d.states.known(r),
    ...(keepable(r) ? { onLog: (line: SandboxLogLine) => d.logs.append(r.id, { ...line, fields: line.fields ?? {} }) } : {}),
  }));
  const report = await d.runtime.recover(known);
  const summary: RecoverySummary<S> = { adopted: 0, paused: 0, killed: 0, stayedPaused: 0, report };
  for (const r of left) {
    if (r.state === "paused") {
      summary.stayedPaused++;
      continue;
    }
    const outcome: RecoveredSandbox<S> = keepable(r) ? (report.recovered.get(r.id) ?? { kind: "gone", why: `node restarted while ${r.state}` }) : { kind: "gone", why: r.error ?? `node restarted while ${r.state}` };
    if (r.state === "resuming" && resumable(d, r)) {
      d.events.transition(r.id, "resuming", "paused", { error: "the node restarted while the sandbox resumed; it stays paused" });
      summary.paused++;
      continue;
    }
    switch (outcome.kind) {
      case "adopted":
        adopt(d, r, outcome.sandbox);
        summary.adopted++;
        break;
      case "paused":
        if (r.state === "running") d.events.transition(r.id, "running", "pausing", {}, "vm_lost");
        d.events.transition(r.id, "pausing", "paused", { runtimeState: outcome.runtimeState, endpoint: null, snapshotKind: outcome.snapshotKind, error: outcome.why }, "vm_lost");
        d.log.warn({ sandboxId: r.id, was: r.state, reason: outcome.why }, "sandbox paused with its files: its VM did not survive the node restart");
        summary.paused++;
        break;
      case "gone": {
        const t = d.clock.now();
        const error = r.error ?? outcome.why;
        const sandbox = d.store.update(r.id, { state: "killed", error, endpoint: null }, t)!;
        d.events.stored({ id: r.id, from: r.state, to: "killed", at: t, sandbox, reason: "orphaned" }, error);
        d.log.warn({ sandboxId: r.id, was: r.state, reason: outcome.why }, "sandbox did not survive the node restart");
        summary.killed++;
        break;
      }
    }
  }
  return summary;
}

/** Whether resuming `r` can go back to paused: its stored state (naming its pause snapshot) reads back. */
function resumable<S>(d: RecoveryDeps<S>, r: SandboxRecord): boolean {
  return r.runtimeState != null && d.states.known(r).runtimeState !== null;
}

/** `r`'s VM runs on under this node: its record carries the runtime's state, its end is watched. */
function adopt<S>(d: RecoveryDeps<S>, r: SandboxRecord, started: RuntimeSandbox<S>): void {
  const fields = { endpoint: started.endpoint, runtimeState: started.runtimeState };
  if (r.state === "pausing") d.events.transition(r.id, "pausing", "running", fields);
  else d.store.update(r.id, fields, d.clock.now());
  d.logs.append(r.id, { at: d.clock.now(), level: "info", source: "lifecycle", message: "sandbox adopted by the restarted node: its VM ran on", fields: {} });
  d.exits.watch(r.id, started);
}

/** What `keepFilesOfLost` needs. */
export interface LossDeps<S> {
  store: SandboxStore;
  events: SandboxEvents;
  runtime: SandboxRuntime<S>;
  states: StoredStates<S>;
  log: Logger;
}

/**
 * Running sandbox `r`'s VM ended by itself or lost a drive (`why`), while this node ran: it is
 * paused with its disk as the VM left it (`running -> pausing -> paused`, reason `vm_lost`, a
 * filesystem-only snapshot: the next connect cold-boots it), or, when the disk cannot be kept (no
 * snapshot support, an unreadable stored state, the upper files lost), failed and its leftovers
 * freed. Call under the sandbox's lock, its end no longer watched.
 */
export async function keepFilesOfLost<S>(d: LossDeps<S>, r: SandboxRecord, why: string): Promise<void> {
  const snapshots = d.runtime.snapshots;
  let st: S | null = null;
  try {
    st = d.states.of(r);
  } catch (e) {
    d.log.warn({ sandboxId: r.id, err: e }, "the lost sandbox's stored state does not parse: its disk cannot be kept");
  }
  if (snapshots && st !== null) {
    d.events.transition(r.id, "running", "pausing", {}, "vm_lost");
    try {
      const paused = await snapshots.salvage(r.id, st, why);
      d.events.transition(r.id, "pausing", "paused", { runtimeState: paused, endpoint: null, snapshotKind: "filesystem", error: why }, "vm_lost");
      d.log.warn({ sandboxId: r.id, reason: why }, `sandbox paused with its files: ${why}`);
      return;
    } catch (e) {
      const error = `${why}; its disk could not be kept: ${errorMessage(e)}`;
      d.log.error({ sandboxId: r.id, err: e }, `sandbox failed: ${error}`);
      d.events.transition(r.id, "pausing", "failed", { error, endpoint: null });
      await d.runtime.kill(r.id, st).catch((k) => d.log.error({ sandboxId: r.id, err: k }, "clean-up after a failed salvage failed"));
      return;
    }
  }
  d.log.error({ sandboxId: r.id, reason: why }, `sandbox failed: ${why}`);
  d.events.transition(r.id, "running", "failed", { error: why, endpoint: null });
  await d.runtime.kill(r.id, d.states.forKill(r)).catch((e) => d.log.error({ sandboxId: r.id, err: e }, "clean-up after exit failed"));
}
