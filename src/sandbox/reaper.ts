/**
 * Start-up reconciliation of the VM runtime after a crash: VMMs a previous run left are stopped
 * (their VMM records, src/vmm), disk mounts and sandbox work dirs go (a paused sandbox's state
 * is its snapshot), and snapshots only running sandboxes needed are removed: pause snapshots no
 * paused sandbox names, fork checkpoints, tombstoned snapshots, boot snapshots of another kernel,
 * tools drive or driver. Their layers go at once unless another snapshot names them.
 */
import { readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import type { ReapReport, RuntimeKnownSandbox } from "../orchestrator/runtime.ts";
import { layersOf, type LocalRepository } from "../snapshot/index.ts";
import { reapStaleMounts } from "../storage/daemon/index.ts";
import { reapLeftovers } from "../vmm/index.ts";
import { staleBootSnapshots, type BootKeys } from "./boot-snapshot.ts";
import type { VmState } from "./vm-state.ts";

/** What the reaper looks at. */
export interface ReaperDeps {
  homePath: string;
  runtimePath: string;
  repo: LocalRepository;
  /** What makes a boot snapshot current now; throws when the kernel or tools drive is missing. */
  bootKeys: () => BootKeys;
  log: Logger;
}

/**
 * Reconcile with what a previous run left. `known`: the sandboxes the database still has in a
 * live state (or failed), with their stored runtime state.
 */
export async function reap(d: ReaperDeps, known: RuntimeKnownSandbox<VmState>[]): Promise<ReapReport> {
  const stoppedVms = await reapLeftovers(d.runtimePath);
  const removed: string[] = reapStaleMounts([join(d.homePath, "sandboxes")]).map((m) => `mount ${m}`);
  // nothing runs now: sandboxes' work dirs are gone with their VMs (a paused sandbox's state is
  // its snapshot)
  const dir = join(d.homePath, "sandboxes");
  for (const name of safeReaddir(dir)) {
    rmSync(join(dir, name), { recursive: true, force: true });
    removed.push(`sandboxes/${name}`);
  }
  const keep = pauseSnapshotsToKeep(known, d.log);
  const dropped: string[] = [];
  for (const m of d.repo.list({ hidden: true })) {
    const kept = keep.get(m.source.sandboxId ?? "");
    const orphanPause = m.kind === "pause" && kept !== "all" && kept !== m.id;
    // fork checkpoints and tombstoned snapshots only lived for sandboxes that ran
    if (orphanPause || m.kind === "fork" || d.repo.isTombstoned(m.id)) {
      d.repo.remove(m.id);
      dropped.push(...layersOf(m).map((l) => l.digest));
      removed.push(`snapshot ${m.id} (${m.kind})`);
    }
  }
  // boot snapshots of another kernel, tools drive or driver: no VM of this node runs from them now
  try {
    for (const m of staleBootSnapshots(d.repo, d.bootKeys())) {
      d.repo.remove(m.id);
      dropped.push(...layersOf(m).map((l) => l.digest));
      removed.push(`snapshot ${m.id} (boot, stale)`);
    }
  } catch (e) {
    d.log.warn({ err: e }, "stale boot snapshots not looked for (no kernel or tools drive yet)");
  }
  // nothing restores yet: their layers go now unless another snapshot names them (no grace)
  const gc = d.repo.gc([], Date.now(), dropped);
  removed.push(...gc.layers.map((l) => `layer ${l}`), ...gc.staging.map((s) => `staging ${s}`));
  return { stoppedVms, removed };
}

function safeReaddir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/**
 * Which pause snapshots the start-up reap keeps, per sandbox id: a paused sandbox keeps the one
 * its stored state names; a paused sandbox whose stored state does not parse (or has none, or names none)
 * keeps every pause snapshot of its own, "all", and is logged: a damaged record never costs the
 * data it may point to (its resume then fails with `orchestrator.bad_runtime_state`). Sandboxes
 * that are not paused keep none.
 */
function pauseSnapshotsToKeep(known: RuntimeKnownSandbox<VmState>[], log: Logger): Map<string, string | "all"> {
  const keep = new Map<string, string | "all">();
  for (const k of known) {
    if (k.state !== "paused") continue;
    if (k.unreadable) {
      log.error({ sandboxId: k.id, err: k.unreadable }, "paused sandbox with an unreadable runtime state: its pause snapshots are kept");
      keep.set(k.id, "all");
      continue;
    }
    const paused = k.runtimeState?.paused;
    if (paused === undefined) log.error({ sandboxId: k.id }, "paused sandbox whose runtime state names no pause snapshot: its pause snapshots are kept");
    keep.set(k.id, paused ?? "all");
  }
  return keep;
}
