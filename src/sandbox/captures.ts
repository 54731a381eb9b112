/**
 * Committing a running sandbox VM as a snapshot on top of the base it runs from: its device
 * state and the memory pages changed since the image it maps (capture.ts), and its disk upper's
 * data. Three kinds, one path:
 * - pause: capture, stop the VMM, commit a `pause` snapshot; the work dir and slot go (a resume
 *   starts from that snapshot);
 * - filesystem-only pause: stop the VMM without a capture (the orchestrator has flushed the
 *   guest's filesystems and unmounted its volumes), commit the upper as a disk-only `pause`
 *   snapshot (a resume cold-boots from it);
 * - snapshot or fork checkpoint: capture, let the VM run on, commit a `user` or `fork` snapshot.
 *   A paused sandbox's pause snapshot is committed again under the new kind and names.
 */
import { rmSync } from "node:fs";
import type { Logger } from "pino";
import { OrchestratorError } from "../orchestrator/errors.ts";
import type { RuntimeSnapshots, SnapshotInfo, SnapshotRequest } from "../orchestrator/runtime.ts";
import { layersOf, newSnapshotId, SNAPSHOT_NAME_RE, SnapshotError, type CommitTxn, type LayerRef, type SnapshotManifest } from "../snapshot/index.ts";
import { upperPaths } from "../storage/daemon/index.ts";
import { snapshotInfo, type BaseResolver } from "./base-resolver.ts";
import { captureVm, commitUpper, layerPaths, type CapturedVm, type KernelKeys } from "./capture.ts";
import type { VmRuntimeOptions } from "./options.ts";
import type { RunningVms } from "./running-vms.ts";
import type { SnapshotUsers } from "./snapshot-users.ts";
import type { VmState } from "./vm-state.ts";
import { pausedSandboxRecord } from "./shared-pauses.ts";

const MiB = 1024 * 1024;

/** Size, time and bytes of one capture (pause or snapshot), as its log line has them. */
export interface CaptureReport {
  snapshotId: string;
  /** Guest RAM bytes changed since the base image. */
  changedMemoryBytes: number;
  /** Bytes written to the repository (state, memory layer, disk layer). */
  bytesWritten: number;
  /** How long the VM was paused (for a pause: until the VMM stopped), ms. */
  pauseMs: number;
  totalMs: number;
}

/** One commit of a running VM: what it is committed as, whether its memory is captured, and whether the VM runs on. */
interface CommitPlan {
  kind: SnapshotManifest["kind"];
  names: string[];
  memory: boolean;
  vmAfter: "stopped" | "running";
  /** A pause's sandbox record (`SnapshotManifest.sandbox`): another node may resume it from a shared store. */
  sandbox?: Record<string, unknown>;
}

/** Pauses and snapshots of sandbox VMs, and the snapshots users took. */
export class Captures implements RuntimeSnapshots<VmState> {
  constructor(
    private readonly o: VmRuntimeOptions,
    private readonly vms: RunningVms,
    private readonly users: SnapshotUsers,
    private readonly resolver: BaseResolver,
    private readonly kernelKeys: KernelKeys,
    private readonly log: Logger,
  ) {}

  private get repo() {
    return this.o.snapshots.repo;
  }

  /**
   * Pause sandbox `id`: commit a pause snapshot (with its memory, or only its disk, and the
   * orchestrator's `record` of it when it may move to another node), stop its VM, free its work
   * dir and slot. A failure before the VMM stopped leaves the VM running.
   * @returns the paused sandbox's state (naming the pause snapshot)
   * @throws OrchestratorError `orchestrator.runtime_failed` (no VM), `orchestrator.snapshot_missing`
   *   (no base), SnapshotError, VmmError
   */
  async pause(id: string, st: VmState, signal: AbortSignal, memory: boolean, record?: Record<string, unknown> | null): Promise<VmState> {
    const sandbox = pausedSandboxRecord(st, record) as Record<string, unknown> | undefined;
    const { base, m, report } = await this.commit(id, st, { kind: "pause", names: [], memory, vmAfter: "stopped", sandbox }, signal);
    this.log.info({ sandboxId: id, ...report }, memory ? "sandbox paused" : "sandbox paused (filesystem only)");
    rmSync(st.workDir, { recursive: true, force: true });
    await this.vms.releaseSlot(id);
    this.users.leave(id, base, st.bootSnapshot?.id);
    return { ...st, rootDisk: "", vmmPid: undefined, held: undefined, paused: m.id, bootSnapshot: undefined };
  }

  /**
   * Keep sandbox `id`'s disk as its VM left it (the VM died or lost a drive: `why`): what is left
   * of the VM is stopped, its exports closed and its slot released, then its upper is committed
   * as a filesystem-only pause snapshot (the guest's ext4 journal is replayed at its next boot)
   * and its work dir goes. A failure leaves the work dir for the kill that follows.
   * @returns the paused sandbox's state
   * @throws OrchestratorError `orchestrator.snapshot_missing` (no base), SnapshotError,
   *   OverlaybdError (the upper files are gone or unreadable)
   */
  async salvage(id: string, st: VmState, why: string): Promise<VmState> {
    const t0 = performance.now();
    await this.vms.teardown(id, false);
    const m = await this.commitDisk(id, st);
    this.log.warn({ sandboxId: id, snapshotId: m.id, reason: why, totalMs: Math.round(performance.now() - t0) }, "sandbox disk kept as a filesystem-only pause snapshot");
    rmSync(st.workDir, { recursive: true, force: true });
    this.users.leave(id, st.base, st.bootSnapshot?.id);
    return { ...st, rootDisk: "", vmmPid: undefined, held: undefined, paused: m.id, bootSnapshot: undefined };
  }

  /** Commit the upper of sandbox `id`, whose VM is gone, as a filesystem-only pause snapshot over its base. */
  private async commitDisk(id: string, st: VmState): Promise<SnapshotManifest> {
    const base = this.resolver.baseOfState(id, st);
    const txn = this.repo.begin();
    try {
      const up = await commitUpper(txn, layerPaths(this.repo, base.disk.layers), upperPaths(st.workDir));
      const m = this.manifestFrom(base, st, { kind: "pause", names: [], sandboxId: id, memory: null, vmState: null, disk: up?.layer ?? null, tools: undefined });
      txn.publish(m);
      return m;
    } catch (e) {
      txn.abort();
      throw e;
    }
  }

  /**
   * Commit a snapshot of sandbox `id`: a running one is paused for the capture and resumes (same
   * VM, same id); a paused one's pause snapshot is committed again under the new kind and names.
   * @throws OrchestratorError `orchestrator.bad_request` (bad name; a sandbox with volumes),
   *   SnapshotError, VmmError
   */
  async take(id: string, st: VmState, req: SnapshotRequest, signal: AbortSignal): Promise<SnapshotInfo> {
    if (req.name !== undefined && !SNAPSHOT_NAME_RE.test(req.name)) {
      throw new OrchestratorError("orchestrator.bad_request", `invalid snapshot name ${JSON.stringify(req.name)}`, { name: req.name });
    }
    if (req.volumes > 0) {
      throw new OrchestratorError("orchestrator.bad_request", `sandbox ${id} has volumes attached: its snapshots could only be restored with the same volumes, which belong to one writer`, { sandboxId: id });
    }
    const names = req.name ? [req.name] : [];
    if (st.paused) return this.recommit(id, st.paused, req.kind, names);
    const { m, report } = await this.commit(id, st, { kind: req.kind, names, memory: true, vmAfter: "running" }, signal);
    this.log.info({ sandboxId: id, ...report, kind: req.kind }, "sandbox snapshot committed");
    return snapshotInfo(m);
  }

  /** Every user snapshot (kind `user`), oldest first. */
  list(): SnapshotInfo[] {
    return this.repo
      .list()
      .filter((m) => m.kind === "user")
      .map(snapshotInfo);
  }

  /**
   * Delete a user or fork snapshot by id or name. One still used by a running sandbox is hidden
   * at once and removed when its last user stops (its files stay until then).
   * @returns false when no such snapshot exists
   */
  async delete(ref: string): Promise<boolean> {
    const m = this.resolver.findSnapshot(ref, ["user", "fork"]);
    if (!m) return false;
    this.users.retire(m.id);
    return true;
  }

  /** A paused sandbox's pause snapshot `paused` committed again as `kind` named `names`. */
  private async recommit(id: string, paused: string, kind: SnapshotManifest["kind"], names: string[]): Promise<SnapshotInfo> {
    const p = this.repo.find(paused);
    if (!p) throw new OrchestratorError("orchestrator.snapshot_missing", `snapshot of sandbox ${id} is missing`, { sandboxId: id });
    // the paused sandbox's record stays with its pause snapshot: a user snapshot is no sandbox
    const { sandbox: _record, ...copied } = p;
    const m: SnapshotManifest = { ...copied, id: newSnapshotId(), kind, names, createdAt: new Date().toISOString() };
    // its layers may have left the layer cache since the pause
    const hold = await this.o.snapshots.remote?.acquire(layersOf(p));
    try {
      this.repo.begin().publish(m);
    } finally {
      hold?.release();
    }
    return snapshotInfo(m);
  }

  /**
   * Commit running sandbox `id` per `plan`, with a report of what it cost. With memory the VM is paused for
   * the capture; it then resumes, or its VMM stops (before its disk exports close: they must
   * outlive every access). A failure aborts the commit; a VM not yet stopped is resumed.
   */
  private async commit(id: string, st: VmState, plan: CommitPlan, signal: AbortSignal): Promise<{ base: SnapshotManifest; m: SnapshotManifest; report: CaptureReport }> {
    const vm = this.vms.requireVm(id);
    const base = this.resolver.baseOfState(id, st);
    const t0 = performance.now();
    const ms = () => Math.round(performance.now() - t0);
    const txn = this.repo.begin();
    let stopped = false;
    try {
      if (signal.aborted) throw signal.reason;
      let cap: CapturedVm | undefined;
      let up: Awaited<ReturnType<typeof commitUpper>>;
      let pauseMs: number;
      if (plan.memory) await vm.pause();
      try {
        if (plan.memory) cap = await captureVm(vm, txn, st.memoryMiB * MiB, this.parentMemory(base, st));
        if (plan.vmAfter === "stopped") {
          await this.vms.stopVm(id, vm);
          stopped = true;
          await this.vms.closeDisks(id);
        }
        pauseMs = ms();
        up = await commitUpper(txn, layerPaths(this.repo, base.disk.layers), upperPaths(st.workDir));
      } finally {
        if (plan.vmAfter === "running") {
          await vm.resume();
          pauseMs = ms();
        }
      }
      const m = this.manifestFrom(base, st, { kind: plan.kind, names: plan.names, sandboxId: id, memory: cap?.memory ?? null, vmState: cap?.vmState ?? null, disk: up?.layer ?? null, tools: cap ? this.toolsRef(txn, base, st) : undefined });
      if (plan.sandbox) m.sandbox = plan.sandbox;
      txn.publish(m);
      const report = { snapshotId: m.id, changedMemoryBytes: cap?.changedBytes ?? 0, bytesWritten: (cap?.bytesWritten ?? 0) + (up?.bytes ?? 0), pauseMs, totalMs: ms() };
      return { base, m, report };
    } catch (e) {
      txn.abort();
      // a pause that failed before the VMM stopped leaves it running: the orchestrator decides
      // (it kills a sandbox whose pause failed); without memory the VM was never paused, and a
      // stopped one is gone but its upper is still in the work dir (the sandbox can be killed)
      if (plan.vmAfter === "stopped" && plan.memory && !stopped) await vm.resume().catch(() => {});
      throw e;
    }
  }

  /** Layer files of the memory image a running VM maps (none after a cold boot that booted). */
  private parentMemory(base: SnapshotManifest, st: VmState): string[] {
    if (st.bootSnapshot) return layerPaths(this.repo, st.bootSnapshot.memory);
    return !st.coldBoot && base.memory ? layerPaths(this.repo, base.memory.layers) : [];
  }

  /** The manifest of a capture of sandbox `sandboxId` running from `base` (`memory` null: disk only). */
  private manifestFrom(
    base: SnapshotManifest,
    st: VmState,
    c: { kind: SnapshotManifest["kind"]; names: string[]; sandboxId: string; memory: LayerRef | null; vmState: LayerRef | null; disk: LayerRef | null; tools: LayerRef | undefined },
  ): SnapshotManifest {
    const disk = [...base.disk.layers, ...(c.disk ? [c.disk] : [])];
    const mapped = st.bootSnapshot ? st.bootSnapshot.memory : !st.coldBoot && base.memory ? base.memory.layers : [];
    const memory = c.memory ? [...mapped, c.memory] : [];
    for (const [what, n] of [["disk", disk.length], ["memory", memory.length]] as const) {
      if (n > 255) throw new SnapshotError("snapshot.too_many_layers", `the ${what} stack of sandbox ${c.sandboxId} would have ${n} layers (max 255)`, { sandboxId: c.sandboxId, layers: n });
    }
    const kernelKey = st.bootSnapshot ? st.bootSnapshot.kernelKey : st.coldBoot ? this.kernelKeys.of(this.o.kernelPath()) : base.vm.kernelKey;
    return {
      version: 1,
      id: newSnapshotId(),
      kind: c.kind,
      parent: base.id,
      createdAt: new Date().toISOString(),
      names: c.names,
      source: { sandboxId: c.sandboxId, templateId: base.source.templateId },
      vm: { ...base.vm, vcpus: st.vcpus, memoryMiB: st.memoryMiB, mac: st.mac, kernelKey },
      envd: { version: st.envdVersion, accessToken: st.envdToken },
      disk: { virtualSize: base.disk.virtualSize, layers: disk },
      // a disk-only capture (filesystem-only pause) has neither: a start from it cold-boots
      memory: c.memory && c.vmState ? { size: st.memoryMiB * MiB, layers: memory } : null,
      vmState: c.memory && c.vmState ? c.vmState : null,
      ...(c.tools ? { tools: c.tools } : {}),
    };
  }

  /** The tools drive a capture of `st` must name: the base's when restored, else the image it booted through (linked in). */
  private toolsRef(txn: CommitTxn, base: SnapshotManifest, st: VmState): LayerRef | undefined {
    if (st.bootSnapshot) return st.bootSnapshot.tools;
    if (!st.coldBoot) return base.tools;
    return st.toolsImage ? txn.addLayer(st.toolsImage, { keepSource: true }) : undefined;
  }
}
