/**
 * Start-up reconciliation of the VM runtime's files (after adoption.ts has taken over what still
 * runs and stopped the other VMMs): sandbox work dirs of sandboxes that do not run here go (a
 * paused sandbox's state is its snapshot), and snapshots only dead VMs needed are removed: pause
 * snapshots no paused sandbox names, fork checkpoints, tombstoned snapshots, boot snapshots of
 * another kernel, tools drive or driver. What an adopted sandbox runs from is kept (its base,
 * its boot snapshot; a fork checkpoint or tombstoned snapshot goes with its last user). Their
 * layers go at once unless another snapshot names them.
 */
import { readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import type { RuntimeKnownSandbox } from "../orchestrator/runtime.ts";
import { layersOf, type LocalRepository } from "../snapshot/index.ts";
import { staleBootSnapshots, type BootKeys } from "./boot-snapshot.ts";
import type { VmState } from "./vm-state.ts";

/** What the reaper looks at. */
export interface ReaperDeps {
  homePath: string;
  repo: LocalRepository;
  /** What makes a boot snapshot current now; throws when the kernel or tools drive is missing. */
  bootKeys: () => BootKeys;
  log: Logger;
}

/** What start-up recovery kept, which the reaper must not remove. */
export interface KeptAtStart {
  /** Sandboxes whose VM runs on (adopted), with their state: their work dirs and what they run from stay. */
  adopted: ReadonlyMap<string, VmState>;
  /** Sandboxes paused by the recovery (their VM was lost), with the pause snapshot that holds them now. */
  paused: ReadonlyMap<string, string>;
}

/**
 * Reconcile the files with what a previous run left. `known`: the sandboxes the database still
 * has in a live state (or failed), with their stored runtime state.
 * @returns what was removed, described for the log
 */
export function reapFiles(d: ReaperDeps, known: RuntimeKnownSandbox<VmState>[], kept: KeptAtStart): string[] {
  const removed: string[] = [];
  // sandboxes' work dirs are gone with their VMs (a paused sandbox's state is its snapshot)
  const dir = join(d.homePath, "sandboxes");
  for (const name of safeReaddir(dir)) {
    if (kept.adopted.has(name)) continue;
    rmSync(join(dir, name), { recursive: true, force: true });
    removed.push(`sandboxes/${name}`);
  }
  const keep = pauseSnapshotsToKeep(known, d.log);
  for (const [id, snap] of kept.paused) keep.set(id, snap);
  const inUse = new Set<string>();
  for (const st of kept.adopted.values()) {
    inUse.add(st.base);
    if (st.bootSnapshot) inUse.add(st.bootSnapshot.id);
  }
  const dropped: string[] = [];
  for (const m of d.repo.list({ hidden: true })) {
    if (inUse.has(m.id)) continue;
    const held = keep.get(m.source.sandboxId ?? "");
    const orphanPause = m.kind === "pause" && held !== "all" && held !== m.id;
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
      if (inUse.has(m.id)) continue;
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
  return removed;
}

function safeReaddir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/**
 * Which pause snapshots the start-up reap keeps, per sandbox id: a paused (or resuming) sandbox keeps the one
 * its stored state names; a paused sandbox whose stored state does not parse (or has none, or names none)
 * keeps every pause snapshot of its own, "all", and is logged: a damaged record never costs the
 * data it may point to (its resume then fails with `orchestrator.bad_runtime_state`). Sandboxes
 * that are not paused keep none.
 */
function pauseSnapshotsToKeep(known: RuntimeKnownSandbox<VmState>[], log: Logger): Map<string, string | "all"> {
  const keep = new Map<string, string | "all">();
  for (const k of known) {
    // a resume cut by the restart: the sandbox goes back to paused on its pause snapshot
    if (k.state !== "paused" && k.state !== "resuming") continue;
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
