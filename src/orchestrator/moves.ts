/**
 * Sandboxes moving between the nodes of a cluster (the runtime's `shared` port, a snapshot store
 * the nodes share). The scheduler decides where a sandbox lives; this node follows:
 * - `takeOver`: a paused sandbox whose node is gone, moved here by the scheduler (the gateway's
 *   connect says so), is read from the shared store (record + pause snapshot) and stored here as
 *   paused under the same id; the connect then resumes it as any paused sandbox.
 * - `release`: a sandbox this node still has but another node holds now (moved while this node
 *   was away) is dropped here without losing data: a paused copy whose pause snapshot is the one
 *   the store named (what the other node resumed from) just goes, leaving the store's copy; any
 *   other copy holds state the store lacks (it ran here after that pause) and is first committed
 *   as a user snapshot named `fenced-<id>`, then killed.
 */
import type { Logger } from "pino";
import type { Clock } from "../util/deadline-timer.ts";
import { errorMessage } from "../util/error.ts";
import { notFound } from "./errors.ts";
import type { SandboxEvents } from "./events.ts";
import type { KeyedLock } from "./lock.ts";
import { importedRecord } from "./portable.ts";
import type { SandboxRuntime, SnapshotInfo } from "./runtime.ts";
import type { StoredStates } from "./runtime-state.ts";
import { publicState } from "./states.ts";
import type { SandboxStore } from "./store.ts";

/** What `release` did with this node's copy of a sandbox another node holds. */
export type ReleaseOutcome =
  /** Nothing live here. */
  | { kind: "absent" }
  /** The paused copy went; the shared store's copy is the other node's. */
  | { kind: "dropped" }
  /** State the store lacks was kept as user snapshot `snapshotId` (`fenced-<id>`), then the copy went. */
  | { kind: "kept"; snapshotId: string }
  /** The copy could not be kept as a snapshot (volumes attached, a failure): it stays, logged. */
  | { kind: "refused"; reason: string };

/** What the moves need of the orchestrator. */
export interface MovesDeps<S> {
  runtime: SandboxRuntime<S>;
  store: SandboxStore;
  events: SandboxEvents;
  states: StoredStates<S>;
  lock: KeyedLock;
  clock: Clock;
  log: Logger;
  /** Kill sandbox `id` (reason "moved"). */
  kill(id: string): Promise<void>;
  /** Commit a user snapshot of running or paused sandbox `id` named `name`. */
  snapshot(id: string, name: string): Promise<SnapshotInfo>;
}

/** Take-overs and releases of sandboxes between nodes. */
export class SandboxMoves<S> {
  constructor(private readonly d: MovesDeps<S>) {}

  /**
   * Take paused sandbox `id` over from the shared store, unless it is live here already (an
   * earlier take-over). Nothing is stored when the store has no pause snapshot of it.
   * @returns whether it was taken over now
   * @throws OrchestratorError not_found (no shared store, or no pause snapshot of `id` in it),
   *   bad_runtime_state (a record that does not parse); SnapshotError `snapshot.remote_failed`
   *   (the store did not answer)
   */
  takeOver(id: string): Promise<boolean> {
    const shared = this.d.runtime.shared;
    if (!shared) return Promise.reject(notFound(id));
    return this.d.lock.run(id, async () => {
      const cur = this.d.store.get(id);
      if (cur && publicState(cur.state) !== null) return false;
      const found = await shared.find(id);
      if (!found) throw notFound(id);
      const now = this.d.clock.now();
      let rec;
      try {
        rec = importedRecord(id, found.record, found.runtimeState, now);
      } catch (e) {
        // not taken over: what find adopted here must never take the store's copy with it
        await shared.release(id, found.runtimeState).catch((err) => this.d.log.error({ sandboxId: id, err }, "letting go of a pause snapshot not taken over failed"));
        throw e;
      }
      if (!this.d.store.insertOrReplaceEnded(rec)) return false;
      this.d.events.stored({ id, from: null, to: "paused", at: now, sandbox: rec });
      this.d.events.recount();
      this.d.log.warn({ sandboxId: id }, "paused sandbox taken over from the shared snapshot store (its node is gone)");
      return true;
    });
  }

  /** Drop this node's copy of sandbox `id`, which another node holds now (see the module comment). Never throws. */
  async release(id: string): Promise<ReleaseOutcome> {
    const r = this.d.store.get(id);
    if (!r || publicState(r.state) === null) return { kind: "absent" };
    const shared = this.d.runtime.shared;
    try {
      const st = r.state === "paused" ? this.d.states.of(r) : null;
      if (st !== null && shared?.stored(id, st)) {
        await shared.release(id, st);
        await this.d.kill(id);
        this.d.log.warn({ sandboxId: id }, "sandbox held by another node now: this node's paused copy dropped (the shared store keeps what that node resumed from)");
        return { kind: "dropped" };
      }
      const snap = await this.d.snapshot(id, `fenced-${id}`);
      // the kill also takes this copy's own pause snapshot (and any record naming it) out of the store
      await this.d.kill(id);
      this.d.log.error({ sandboxId: id, snapshotId: snap.snapshotID }, `sandbox held by another node now, but this node's copy had state the shared store lacks: kept as snapshot fenced-${id}, then dropped`);
      return { kind: "kept", snapshotId: snap.snapshotID };
    } catch (e) {
      this.d.log.error({ sandboxId: id, err: e }, "sandbox held by another node now, and this node's copy could not be let go without losing data: kept");
      return { kind: "refused", reason: errorMessage(e) };
    }
  }
}
