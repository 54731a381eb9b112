/**
 * Starting a sandbox VM from a snapshot: its root disk (the snapshot's disk layers plus a fresh
 * upper of its own, `sandboxes/<id>/upper/`, served by the disk daemon) and volume drives, a
 * network slot, the VMM, then envd. With a memory image the VM is restored from it (the image
 * served read-only once per stack and mapped copy-on-write by every VM using it), else it
 * cold-boots from the disk: by restoring the boot snapshot of its shape and number of volumes
 * when it can (boot-snapshots.ts), by booting the kernel otherwise. What the start acquired is
 * freed when it fails, on every path.
 */
import { rmSync } from "node:fs";
import type { Logger } from "pino";
import { ENVD_PORT } from "../envd/version.ts";
import { guestAddress, netSpec, type AllocatedSlot } from "../net/index.ts";
import type { RuntimeSandbox, RuntimeStartSpec } from "../orchestrator/runtime.ts";
import { layersOf, type ImageLease, type LayerHold, type SnapshotManifest } from "../snapshot/index.ts";
import type { DiskExport } from "../storage/daemon/index.ts";
import { KEEP_TMP_ARG, keptBootArgs, toolsBoot } from "../tools/index.ts";
import type { DriveSpec, VmHandle, VmSpec } from "../vmm/index.ts";
import { restoreBootSnapshot, RootMountError } from "./boot-snapshot.ts";
import { BOOT_SNAPSHOT_TIMEOUT_MS, type BootSnapshots } from "./boot-snapshots.ts";
import { layerPaths, memoryKey } from "./capture.ts";
import { consoleLogLine } from "./console-lines.ts";
import { sandboxPolicy } from "./egress.ts";
import { envdUrl, initGuest, startTemplateProcess } from "./guest-start.ts";
import type { VmRuntimeOptions } from "./options.ts";
import type { RunningVms } from "./running-vms.ts";
import type { SnapshotUsers } from "./snapshot-users.ts";
import { VM_STATE_VERSION, type StartedFrom, type VmState } from "./vm-state.ts";
import { mountVolumesInGuest } from "./volumes.ts";
import { WARM_KINDS, type WarmImages } from "./warm-images.ts";

/**
 * How a start uses the snapshot it starts from.
 * - `create`: a restore of the snapshot's memory when the request's shape is the snapshot's and
 *   it mounts no volumes (a restore keeps the snapshot's devices and memory size), else a cold
 *   boot of its disk;
 * - `pool`: a VM of the restore pool, made ahead of a create (a restore: the pool keeps only
 *   restorable snapshots);
 * - `resume`: a paused sandbox's pause snapshot (its own shape and volumes): a restore, or with
 *   `memory: false` a cold boot of its disk.
 */
export type StartMode = { kind: "create" } | { kind: "pool" } | { kind: "resume"; memory: boolean };

/** Steps of a start, ms, as its log line has them (benchmarks read them there). */
export interface StartTimings {
  /** Digest checks of the snapshot's layers (once per node process and file). */
  verifyMs: number;
  /** Root disk (fresh upper over the snapshot's disk layers) and volume drives served. */
  diskMs: number;
  /** Network slot taken (from the warm pool when it has one). */
  slotMs: number;
  /** Shared memory image acquired (served once per stack). */
  memoryMs: number;
  /** VMM spawned and the device state loaded (restore) or the kernel booted until spawned (cold). */
  vmmMs: number;
  /** envd: health answered, /init done, volumes mounted, template process started; = healthMs + initMs + the rest. */
  envdMs: number;
  /** Part of vmmMs until the VMM answered its control socket (QEMU: spawn + QMP), when the driver reports it. */
  vmmSpawnMs: number;
  /** Part of envdMs until envd's GET /health answered. */
  healthMs: number;
  /** Part of envdMs spent in envd's POST /init. */
  initMs: number;
  totalMs: number;
  restored: boolean;
  /** A cold boot that restored a boot snapshot (memoryMs, vmmMs: its image and restore; the root mount is in vmmMs). */
  fromBootSnapshot?: boolean;
  /** Started from the restore pool (a VM restored ahead): slotMs is its policy update, vmmMs its continue. */
  pooled: boolean;
}

/** Timings of a start with every step at 0. */
export function noTimings(restored: boolean, pooled: boolean): StartTimings {
  return { verifyMs: 0, diskMs: 0, slotMs: 0, memoryMs: 0, vmmMs: 0, vmmSpawnMs: 0, envdMs: 0, healthMs: 0, initMs: 0, totalMs: 0, restored, pooled };
}

/** Whether a start in `mode` of `spec` from `base` restores the snapshot's memory. */
function restores(mode: StartMode, spec: RuntimeStartSpec, base: SnapshotManifest): boolean {
  if (base.memory === null || base.vmState === null) return false;
  if (mode.kind === "resume") return mode.memory;
  return spec.volumes.length === 0 && spec.cpuCount === base.vm.vcpus && spec.memoryMB === base.vm.memoryMiB;
}

/** What one start holds so far; freed in `abandon` when it fails. */
interface Held {
  /** The snapshot's layers, held in the layer cache while the VM runs (object store only). */
  layers?: LayerHold;
  /** The memory image of a restore. */
  lease?: ImageLease;
  /** The boot snapshot a cold boot restores, with its layers. */
  bootSnap?: SnapshotManifest;
  bootLayers?: LayerHold;
  vm?: VmHandle;
}

/** Where one start's VM is: the parts of its VmSpec known once the disk, drives and slot are. */
interface Placement {
  id: string;
  workDir: string;
  disk: DiskExport;
  volumeDrives: DriveSpec[];
  slot: AllocatedSlot;
}

/** Starts sandbox VMs. */
export class Launcher {
  constructor(
    private readonly o: VmRuntimeOptions,
    private readonly vms: RunningVms,
    private readonly users: SnapshotUsers,
    private readonly boots: BootSnapshots,
    private readonly warm: WarmImages,
    private readonly log: Logger,
  ) {}

  private get repo() {
    return this.o.snapshots.repo;
  }

  /**
   * Start sandbox `spec.id` from snapshot `base` in `mode` and wait until envd is initialised.
   * @throws whatever the failing step throws (logged with the step), with everything the start
   *   made freed
   */
  async launch(spec: RuntimeStartSpec, base: SnapshotManifest, from: StartedFrom, mode: StartMode): Promise<RuntimeSandbox<VmState>> {
    const id = spec.id;
    const restore = restores(mode, spec, base);
    const t = noTimings(restore, false);
    const t0 = performance.now();
    let mark = t0;
    const lap = () => {
      const now = performance.now();
      const d = Math.round(now - mark);
      mark = now;
      return d;
    };
    const held: Held = {};
    const step = { now: "verify layers" };
    try {
      const layers = restore ? layersOf(base) : base.disk.layers;
      // with an object store: the missing ones are fetched (digest-checked) and held while the VM runs
      held.layers = await this.o.snapshots.remote?.acquire(layers);
      for (const l of layers) this.repo.verifyLayer(l);
      t.verifyMs = lap();
      step.now = "serve disk";
      const workDir = this.vms.workDir(id);
      // a fresh upper every time: the base holds everything the sandbox wrote before
      rmSync(workDir, { recursive: true, force: true });
      const disk = await this.vms.serveRoot(id, workDir, layerPaths(this.repo, base.disk.layers), base.disk.virtualSize);
      step.now = "serve volumes";
      const volumeDrives = await this.vms.serveVolumes(id, workDir, spec.volumes);
      t.diskMs = lap();
      step.now = "allocate slot";
      const slot = await this.o.net.allocate(sandboxPolicy(spec.network, spec.allowInternetAccess), id);
      t.slotMs = lap();
      const at: Placement = { id, workDir, disk, volumeDrives, slot };
      const vmSpec = (tools: string | undefined, mac: string) => this.vmSpec(spec, base, restore, at, tools, mac, mode.kind === "resume");
      const started = restore ? await this.restoreVm(base, vmSpec, held, step, () => (t.memoryMs = lap())) : await this.coldBootVm(spec, base, at, vmSpec, held, step, t);
      const vm = (held.vm = started.vm);
      this.vms.setVm(id, vm);
      const h = held.layers;
      void vm.exited.then(() => h?.release());
      this.users.use(base.id, id);
      t.vmmMs = lap();
      t.vmmSpawnMs = vm.spawnMs ?? 0;
      step.now = "envd health and /init";
      const bootSnap = held.bootSnap;
      const state: VmState = {
        version: VM_STATE_VERSION,
        workDir,
        rootDisk: disk.path,
        mac: started.mac,
        base: base.id,
        coldBoot: !restore,
        ...(bootSnap ? { bootSnapshot: { id: bootSnap.id, memory: bootSnap.memory!.layers, tools: bootSnap.tools!, kernelKey: bootSnap.vm.kernelKey } } : {}),
        ...(started.toolsImage ? { toolsImage: started.toolsImage } : {}),
        vmmPid: vm.pid,
        held: {
          vmmStartTime: vm.startTime,
          controlSocket: vm.controlSocket,
          slot: slot.idx,
          rootExport: disk.id,
          volumeExports: this.vms.volumeExports(id),
          memoryImages: restore ? [memoryKey(base)] : bootSnap ? [memoryKey(bootSnap)] : [],
        },
        vcpus: started.vcpus,
        memoryMiB: started.memoryMiB,
        envdToken: spec.envdAccessToken,
        envdVersion: base.envd.version,
        template: from,
      };
      const host = guestAddress(slot, ENVD_PORT).host;
      // a restored envd holds the token it had at snapshot time; a booted one has none
      const g = await initGuest(spec, vm, host, state, restore ? base.envd.accessToken : null, from.boot, this.o);
      t.healthMs = g.timings.healthMs;
      t.initMs = g.timings.initMs;
      // a restored guest has its volumes mounted already; a booted one (a create, or a resume
      // from the disk) mounts them (from a boot snapshot: its drives re-probed by the restore)
      if (spec.volumes.length > 0 && !restore) await mountVolumesInGuest(envdUrl(host), spec.envdAccessToken, spec.volumes, this.o.volumes!.guestOpTimeoutMs);
      if (!restore && (from.boot?.startCmd || from.boot?.readyCmd)) await startTemplateProcess(spec, envdUrl(host), from.boot, this.o);
      t.envdMs = lap();
      t.totalMs = Math.round(performance.now() - t0);
      const pool = mode.kind === "pool";
      this.log.info({ sandboxId: id, base: base.id, ...t, ...(bootSnap ? { bootSnapshot: bootSnap.id } : {}) }, pool ? "restore pool VM restored" : restore ? "sandbox restored" : bootSnap ? "sandbox booted from a boot snapshot" : "sandbox booted");
      if (restore && WARM_KINDS.includes(base.kind)) await this.warm.keep(base);
      return { endpoint: { host }, runtimeState: g.state, envdVersion: g.state.envdVersion, exited: vm.exited, lost: this.vms.drivesLost(id) };
    } catch (e) {
      this.log.error({ sandboxId: id, base: base.id, step: step.now, err: e }, `start failed at step: ${step.now}`);
      await this.abandon(id, base, held);
      throw e;
    }
  }

  /** Free what a failed start of sandbox `id` from `base` holds. Never throws. */
  private async abandon(id: string, base: SnapshotManifest, held: Held): Promise<void> {
    if (held.bootSnap) this.users.unuse(held.bootSnap.id, id);
    // with a VM, its exit releases the holds and the memory image
    if (held.vm) this.users.unuse(base.id, id);
    else {
      held.bootLayers?.release();
      await held.lease?.release().catch(() => {});
      held.layers?.release();
    }
    await this.vms.teardown(id, true, held.vm);
  }

  /** The VM of a start placed at `at`, booting through tools drive `tools` with guest MAC `mac`. */
  private vmSpec(spec: RuntimeStartSpec, base: SnapshotManifest, restore: boolean, at: Placement, tools: string | undefined, mac: string, keepTmp: boolean): VmSpec {
    const drivesAndArgs = tools ? toolsBoot(tools, at.disk.path, base.vm.bootArgs) : { drives: [{ id: "root", path: at.disk.path, readOnly: false, isRoot: true }], bootArgs: base.vm.bootArgs };
    // only a sandbox's first boot empties /tmp: a resume that boots (a filesystem-only pause, a
    // VM lost) keeps what its programs left there, as a memory restore does
    if (keepTmp && tools) drivesAndArgs.bootArgs += ` ${KEEP_TMP_ARG}`;
    const sink = spec.onLog;
    return {
      id: at.id,
      workDir: at.workDir,
      kernelPath: this.o.kernelPath(),
      bootArgs: drivesAndArgs.bootArgs,
      vcpus: restore ? base.vm.vcpus : spec.cpuCount,
      memoryMiB: restore ? base.vm.memoryMiB : spec.memoryMB,
      // the same devices in the same order as when the snapshot was taken
      drives: [...drivesAndArgs.drives, ...at.volumeDrives],
      // every slot gives the guest the same address and gateway: a restored guest keeps its config
      net: { ...netSpec(at.slot), mac },
      onConsoleLine: sink ? (line) => sink(consoleLogLine(line, Date.now())) : undefined,
    };
  }

  /**
   * Restore `base` (memory image + device state): the snapshot's MAC and the tools drive its VM
   * booted through (its copy in the repository: the guest has it mounted).
   */
  private async restoreVm(base: SnapshotManifest, vmSpec: (tools: string | undefined, mac: string) => VmSpec, held: Held, step: { now: string }, imageServed: () => void): Promise<StartedVm> {
    const tools = base.tools ? this.repo.layerPath(base.tools) : undefined;
    const spec = vmSpec(tools, base.vm.mac);
    step.now = "serve memory image";
    const lease = (held.lease = await this.o.snapshots.images.acquire(memoryKey(base), layerPaths(this.repo, base.memory!.layers)));
    imageServed();
    step.now = "restore VM";
    const vm = await this.o.driver.restore(spec, { statePath: this.repo.layerPath(base.vmState!), memPath: lease.path, kind: "full" }, { resume: true });
    // the image may go only once the VMM that maps it is gone
    void vm.exited.then(() => lease.release()).catch((e) => this.log.error({ sandboxId: spec.id, err: e }, "memory image release failed"));
    return { vm, mac: base.vm.mac, toolsImage: tools, vcpus: spec.vcpus, memoryMiB: spec.memoryMiB };
  }

  /**
   * Cold-boot `base`'s disk through the node's current tools drive. Without kernel arguments of
   * its own (which a restored kernel would not see), the boot snapshot of its shape and number of
   * volumes is restored instead (made now if missing); when that fails the VM boots.
   */
  private async coldBootVm(spec: RuntimeStartSpec, base: SnapshotManifest, at: Placement, vmSpec: (tools: string | undefined, mac: string) => VmSpec, held: Held, step: { now: string }, t: StartTimings): Promise<StartedVm> {
    const bootable = keptBootArgs(base.vm.bootArgs).length === 0 && this.boots.enabled;
    const snap = bootable ? await this.boots.find({ vcpus: spec.cpuCount, memoryMiB: spec.memoryMB, volumeSlots: at.volumeDrives.length }, spec.signal) : undefined;
    if (snap) {
      // held from here: a stale sweep or the layer cache must not take it while the VM starts
      held.bootSnap = snap;
      this.users.use(snap.id, at.id);
      held.bootLayers = await this.o.snapshots.remote?.acquire(layersOf(snap));
    }
    t.fromBootSnapshot = snap !== undefined;
    if (snap) {
      step.now = "restore boot snapshot";
      const tools = this.repo.layerPath(snap.tools!);
      const envd = envdUrl(guestAddress(at.slot, ENVD_PORT).host);
      const signal = AbortSignal.any([spec.signal, AbortSignal.timeout(BOOT_SNAPSHOT_TIMEOUT_MS)]);
      const vs = vmSpec(tools, snap.vm.mac);
      try {
        const vm = await restoreBootSnapshot({ repo: this.repo, images: this.o.snapshots.images, driver: this.o.driver, envdPollMs: this.o.envdPollMs, log: this.log }, snap, vs, envd, signal);
        const h = held.bootLayers;
        void vm.exited.then(() => h?.release());
        return { vm, mac: snap.vm.mac, toolsImage: tools, vcpus: vs.vcpus, memoryMiB: vs.memoryMiB };
      } catch (e) {
        if (spec.signal.aborted) throw e;
        // the boot snapshot only saves time: this start boots; unless the sandbox's own disk
        // would not mount, so do the shape's next ones for a while
        if (!(e instanceof RootMountError)) this.boots.failed(snap);
        this.log.warn({ sandboxId: at.id, bootSnapshot: snap.id, err: e }, "restoring the boot snapshot failed: booting");
        this.users.unuse(snap.id, at.id);
        held.bootLayers?.release();
        held.bootLayers = undefined;
        held.bootSnap = undefined;
        t.fromBootSnapshot = false;
      }
    }
    step.now = "boot VM";
    const tools = this.o.toolsImage();
    const vs = vmSpec(tools, at.slot.mac);
    const vm = await this.o.driver.boot(vs);
    return { vm, mac: at.slot.mac, toolsImage: tools, vcpus: vs.vcpus, memoryMiB: vs.memoryMiB };
  }
}

/** A started VMM and what its sandbox's state records of how it started. */
interface StartedVm {
  vm: VmHandle;
  mac: string;
  toolsImage: string | undefined;
  vcpus: number;
  memoryMiB: number;
}
