/**
 * The real SandboxRuntime: a sandbox is a microVM (QEMU or Firecracker via src/vmm) in its own
 * network slot (src/net), started from a committed snapshot (src/snapshot), with envd (guest
 * port 49983) initialised over the slot's host address.
 *
 * Snapshots are the unit of state:
 * - every sandbox runs from a *base* snapshot: its root disk is the base's disk layers plus a
 *   fresh upper of its own (`sandboxes/<id>/upper/`, served by the disk daemon as
 *   `sandboxes/<id>/mnt/root.img`); with a memory image the VM is restored from it (the image
 *   served read-only once per stack by the disk daemon and mapped copy-on-write by every VM
 *   using it, see SharedImages), without one it cold-boots from the disk;
 * - a template's base is its committed snapshot (`template build-base` boots it once, a catalog
 *   build may name one), or for a template without one a disk-only snapshot of its layers made on
 *   first use; a create asking for another VM shape, or with volumes, cold-boots from the base's
 *   disk (a restore keeps the snapshot's devices and memory size), by restoring the boot snapshot
 *   of its shape and number of volumes when it can (boot-snapshot.ts);
 * - pause = capture (device state, the memory pages changed since the base, the upper's data)
 *   into a new `pause` snapshot on top of the base, stop the VMM, drop the work dir and slot;
 *   resume = start from that snapshot; a snapshot or fork captures the same way and lets the VM
 *   run on;
 * - snapshots outlive sandboxes; one still used by a running sandbox is tombstoned on delete and
 *   removed when its last user stops.
 * Layout under the data dir: `sandboxes/<id>/` (upper, mount, VMM work files) and the snapshot
 * repository (`snapshots/` by default).
 */
import { readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { ENVD_PORT, ENVD_VERSION } from "../envd/version.ts";
import { guestAddress, netSpec, parseEgressPolicy, type NetworkManager } from "../net/index.ts";
import { logger } from "../observability/log.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { newSandboxId } from "../orchestrator/ids.ts";
import type { ReapReport, RuntimeKnownSandbox, RuntimeMetricsTarget, RuntimeSandbox, RuntimeStartSpec, SandboxRuntime, SnapshotInfo, SnapshotRequest } from "../orchestrator/runtime.ts";
import type { SandboxLogLine, SandboxMetricsSample, TemplateInfo, VolumeMount } from "../orchestrator/types.ts";
import { layersOf, newSnapshotId, SNAPSHOT_ID_RE, SNAPSHOT_NAME_RE, SnapshotError, type CommitTxn, type ImageLease, type LayerHold, type LayerRef, type LocalRepository, type SharedImages, type SnapshotManifest, type SnapshotRemote } from "../snapshot/index.ts";
import { reapStaleMounts, upperPaths, type DiskExport, type DiskService } from "../storage/daemon/index.ts";
import { importSparse } from "../storage/overlaybd/index.ts";
import { resolveTemplate, shownBuild, TemplateCatalog, TemplateError, waitReady, type BootSpec, type BuildRecord, type BuildVmLauncher, type ResolvedTemplate, type TemplateRecord } from "../template/index.ts";
import { reapLeftovers, type DriveSpec, type VmHandle, type VmmDriver, type VmSpec } from "../vmm/index.ts";
import { keptBootArgs, probeCommand, toolsBoot } from "../tools/index.ts";
import { toolsKeyOf } from "./build-snapshot.ts";
import { bootBuildVm, type BuildVmTimeouts } from "./build-vm.ts";
import { parseVmState, type VmState } from "./vm-state.ts";
import { captureVm, commitUpper, KernelKeys, layerPaths, memoryKey, templateManifest } from "./capture.ts";
import { bootShapeKey, bootShapeOf, findBootSnapshot, makeBootSnapshot, restoreBootSnapshot, RootMountError, staleBootSnapshots, type BootKeys, type BootShape } from "./boot-snapshot.ts";
import { consoleLogLine } from "./console-lines.ts";
import { fetchEnvdMetrics, initEnvd, runInGuest, waitEnvdHealthy } from "./envd-client.ts";
import { execInGuest } from "./guest-exec.ts";
import { GuestVolumeFiles } from "./guest-volume-files.ts";
import { mountVolumesInGuest, QUIESCE_SCRIPT, serveVolumeDrives, VmVolumes, type VmVolumesOptions } from "./volumes.ts";
import { RestorePool, type RestorePoolOptions } from "./restore-pool.ts";

const MiB = 1024 * 1024;
/** After a failed boot snapshot build, cold boots of its shape boot for this long before the next try, ms. */
const BOOT_SNAPSHOT_RETRY_MS = 600_000;
/** Bound on booting a boot snapshot's VM to envd, ms. */
const BOOT_SNAPSHOT_TIMEOUT_MS = 120_000;
/** Kinds of snapshot whose memory image is kept warm after restores (`[snapshot] warm_images`): what creates start from. */
const WARM_KINDS: readonly SnapshotManifest["kind"][] = ["template", "user"];

export interface VmRuntimeOptions {
  homePath: string;
  runtimePath: string;
  kernelPath: () => string;
  /** The tools drive image new (cold-booted) VMs boot through (src/tools; read again for every boot). */
  toolsImage: () => string;
  driver: VmmDriver;
  net: NetworkManager;
  defaultCpuCount: number;
  defaultMemoryMB: number;
  envdPollMs: number;
  /** User envd runs commands as by default (templates create `user`, uid 1000). */
  defaultUser: string;
  /** The node's disk daemon (serves root disks, memory images and volume drives); closed by close(). */
  disks: DiskService;
  /**
   * The node's snapshot repository and its shared memory images; `remote` (`[snapshot.s3]`):
   * the object store commits are pushed to and missing snapshots and layers come from.
   */
  snapshots: { repo: LocalRepository; images: SharedImages; gcIntervalMs: number; remote?: SnapshotRemote | null };
  /** Volumes (`[volumes]`); absent: this runtime cannot attach volumes. */
  volumes?: VmVolumesOptions;
  /** Called last by close() (shuts the network manager down). */
  onClose?: () => Promise<void>;
  /** Bound on a template's ready command at sandbox start (cold boot), ms. */
  readyTimeoutMs: number;
  /** Period of polling a template's ready command, ms. */
  readyPollMs: number;
  /** Bound on one run of a template's ready command, ms. */
  readyProbeTimeoutMs: number;
  /** The restore pool (`[pool.restore]`); absent or high watermark 0: none. */
  restorePool?: RestorePoolOptions;
  /** Cold boots restore boot snapshots (`[vm] boot_snapshots`, src/sandbox/boot-snapshot.ts). */
  bootSnapshots?: boolean;
}

/** What the restore pool keeps of a snapshot to make VMs of it. */
interface PoolCtx {
  base: SnapshotManifest;
  from: StartedFrom;
}

/** A VM the restore pool made: its runtime state and where its envd answers. */
interface PreparedVm {
  state: VmState;
  from: StartedFrom;
  host: string;
}

/** What runs in sandboxes of a template (a catalog build's process defaults), or null. */
type BootDefaults = Pick<BootSpec, "envs" | "workdir" | "user" | "startCmd" | "readyCmd"> | null;

/** What a sandbox records of the template it started from (`VmState.template`). */
type StartedFrom = VmState["template"];

/** Steps of a start, ms (logged, and kept for benchmarks). */
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

/** Size, time and bytes of one capture (pause or snapshot). */
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

/** envd's base URL of a running sandbox. */
function envdBase(t: RuntimeMetricsTarget): string {
  return `http://${t.endpoint.host}:${ENVD_PORT}`;
}

/** A VMM console listener that files each line in the sandbox's log, or none without a sink. */
function consoleSink(spec: RuntimeStartSpec): ((line: string) => void) | undefined {
  const sink = spec.onLog;
  return sink ? (line) => sink(consoleLogLine(line, Date.now())) : undefined;
}

export class VmRuntime implements SandboxRuntime {
  readonly name: string;
  private readonly vms = new Map<string, VmHandle>();
  private readonly disks = new Map<string, DiskExport>();
  /** Volume drive exports per sandbox. */
  private readonly volumeDisks = new Map<string, DiskExport[]>();
  /** Snapshot id -> sandboxes whose VM runs from it. */
  private readonly users = new Map<string, Set<string>>();
  /** Boot snapshot builds in progress, and when one last failed, by shape. */
  private readonly bootSnapshotBuilds = new Map<string, Promise<SnapshotManifest | undefined>>();
  private readonly bootSnapshotFailures = new Map<string, number>();
  /** Aborts boot snapshot builds at close (a build serves every waiter, so no one caller's signal ends it). */
  private readonly bootSnapshotAbort = new AbortController();
  /** Memory image key -> the snapshot it was kept warm for (SharedImages.keepWarm). */
  private readonly warmFor = new Map<string, string>();
  /** The restore pool and what it made (by sandbox id). */
  private readonly pool: RestorePool<PoolCtx>;
  private readonly prepared = new Map<string, PreparedVm>();
  /** Log sinks of pooled VMs, set when a create adopts one (its console lines go there from then on). */
  private readonly logSinks = new Map<string, (line: SandboxLogLine) => void>();
  /** Sandbox starts (create, resume) in progress, and when the last one ended (performance.now()). */
  private starting = 0;
  private lastStartEnd = 0;
  private readonly log: Logger = logger("orchestrator.vm");
  private readonly kernelKeys = new KernelKeys();
  private gcTimer: ReturnType<typeof setInterval> | undefined;
  /** The template catalog of this home (built templates and build-base ones). */
  readonly catalog: TemplateCatalog;
  readonly volumes?: VmVolumes;
  /** Last start's step timings and last capture's report (benchmarks read them). */
  lastStart: StartTimings | undefined;
  lastCapture: CaptureReport | undefined;

  constructor(private readonly o: VmRuntimeOptions) {
    this.name = `vm:${o.driver.name}`;
    this.catalog = new TemplateCatalog(o.homePath, (path, err) => this.log.warn({ path, err: err.message }, "unreadable template record skipped"));
    if (o.volumes) this.volumes = new VmVolumes(o.volumes);
    if (o.snapshots.gcIntervalMs > 0) this.gcTimer = setInterval(() => this.gc(), o.snapshots.gcIntervalMs);
    this.pool = new RestorePool<PoolCtx>(o.restorePool ?? { lowWatermark: 0, highWatermark: 0, snapshots: 0, claimTimeoutMs: 1, retryBackoffMs: 1, fillDelayMs: 0 }, {
      fill: (_id, ctx, signal) => this.prepare(ctx, signal),
      discard: (id) => this.discardPrepared(id),
      usable: (id) => {
        try {
          return this.repo.find(id) !== undefined && !this.repo.isTombstoned(id);
        } catch {
          return false;
        }
      },
      quiet: (ms, signal) => this.quiet(ms, signal),
    });
  }

  private get repo(): LocalRepository {
    return this.o.snapshots.repo;
  }

  async listTemplates(): Promise<TemplateInfo[]> {
    return this.catalog.list().map((t) => this.templateInfo(t, shownBuild(t)));
  }

  /**
   * A template by id, alias or `name:tag`, with `buildID` the build that name boots; else a
   * snapshot by id or name (`name` or `name:tag`) described as a template; null when neither.
   */
  async resolveTemplate(ref: string): Promise<TemplateInfo | null> {
    try {
      const { template, build } = this.catalog.readyBuild(ref);
      return this.templateInfo(template, build);
    } catch (e) {
      if (!(e instanceof TemplateError)) throw e;
    }
    const m = this.findSnapshot(ref, ["user", "template", "fork"]) ?? (await this.remoteSnapshot(ref));
    return m ? snapshotTemplateInfo(m) : null;
  }

  private templateInfo(t: TemplateRecord, b: BuildRecord | undefined): TemplateInfo {
    return {
      templateID: t.templateID,
      aliases: t.aliases,
      cpuCount: b?.cpuCount || this.o.defaultCpuCount,
      memoryMB: b?.memoryMB || this.o.defaultMemoryMB,
      diskSizeMB: b?.diskSizeMB ?? 0,
      envdVersion: ENVD_VERSION,
      createdAt: t.createdAt,
      updatedAt: t.updatedAt,
      buildID: b?.buildID ?? "",
      buildStatus: b?.status ?? "waiting",
    };
  }

  /**
   * Boots template build VMs (internal sandboxes outside the orchestrator's table) and keeps the
   * snapshots builds end in (build-snapshot.ts) in the node's repository.
   */
  buildVmLauncher(timeouts: BuildVmTimeouts): BuildVmLauncher {
    return {
      boot: (spec) =>
        bootBuildVm(
          this.o,
          spec,
          timeouts,
          this.o.bootSnapshots
            ? { find: (shape, signal) => this.bootSnapshotFor(shape, signal), use: (snap, vm) => this.use(snap, vm), unuse: (snap, vm) => this.unuse(snap, vm), failed: (snap) => this.bootSnapshotFailed(snap) }
            : undefined,
        ),
      snapshotUsable: (id) => {
        const m = this.repo.find(id);
        if (!m || m.memory === null || m.vmState === null || this.repo.isTombstoned(id)) return false;
        try {
          // taken with the node's current guest kernel and tools drive (a new envd reaches sandboxes)
          return m.vm.kernelKey === this.kernelKeys.of(this.o.kernelPath()) && m.toolsKey === toolsKeyOf(this.o.toolsImage());
        } catch (e) {
          this.log.warn({ err: e, snapshot: id }, "kernel or tools drive unreadable: the build snapshot is not reused");
          return false;
        }
      },
      releaseSnapshot: (id) => {
        // hidden now; removed once no sandbox runs from it (unuse)
        this.repo.tombstone(id);
        if (!this.users.get(id)?.size) this.repo.remove(id);
        this.gc();
      },
    };
  }

  async start(spec: RuntimeStartSpec): Promise<RuntimeSandbox> {
    this.starting++;
    try {
      const { base, boot, rootLayers } = await this.baseFor(spec.template.templateID, spec.template.buildID);
      const pooledFrom = this.pool.take(spec.id);
      if (pooledFrom !== null) {
        if (pooledFrom === base.id) {
          try {
            return await this.adopt(spec, base);
          } catch (e) {
            // the prepared VM is unusable: a restore on request instead, under the same id
            this.log.warn({ sandboxId: spec.id, base: base.id, err: e }, "restore pool VM not adopted: restoring on request");
          }
        }
        await this.discardPrepared(spec.id);
      }
      return await this.launch(spec, base, { rootLayers, boot }, null);
    } finally {
      this.startEnded();
    }
  }

  /**
   * The id of a sandbox the restore pool prepared for a create of `template` in this shape (a VM
   * of its snapshot restored ahead, now reserved), or null when none is ready or the create
   * cannot be a restore (another VM shape, volumes, a snapshot without memory). Either way a
   * restorable create makes its snapshot one the pool keeps VMs of.
   */
  async claimPrepared(template: TemplateInfo, shape: { cpuCount: number; memoryMB: number; volumes: number }): Promise<string | null> {
    if (!this.pool.enabled || shape.volumes > 0) return null;
    let r: { base: SnapshotManifest } & StartedFrom;
    try {
      r = await this.baseFor(template.templateID, template.buildID);
    } catch {
      return null; // start() reports it
    }
    const { base } = r;
    if (!WARM_KINDS.includes(base.kind) || base.memory === null || base.vmState === null || shape.cpuCount !== base.vm.vcpus || shape.memoryMB !== base.vm.memoryMiB) return null;
    this.pool.want(base.id, { base, from: { rootLayers: r.rootLayers, boot: r.boot } });
    return this.pool.claim(base.id);
  }

  async pause(id: string, state: Record<string, unknown>, signal: AbortSignal, opts: { memory: boolean } = { memory: true }): Promise<Record<string, unknown>> {
    const st = parseVmState(id, state);
    const vm = this.vms.get(id);
    if (!vm) throw new OrchestratorError("orchestrator.runtime_failed", `no VM handle for sandbox ${id}`, { sandboxId: id });
    if (!opts.memory) return this.pauseDiskOnly(id, st, vm, signal);
    const base = this.baseOfState(id, st);
    const t0 = performance.now();
    const txn = this.repo.begin();
    let stopped = false;
    let m: SnapshotManifest;
    let report: CaptureReport;
    try {
      if (signal.aborted) throw signal.reason;
      await vm.pause();
      const cap = await captureVm(vm, txn, st.memoryMiB * MiB, this.parentMemory(base, st));
      // the VMM goes first: the disk export and memory image must outlive every access
      await vm.stop();
      stopped = true;
      this.vms.delete(id);
      await this.closeDisk(id);
      const pauseMs = Math.round(performance.now() - t0);
      const up = await commitUpper(txn, layerPaths(this.repo, base.disk.layers), upperPaths(st.workDir));
      m = this.manifestFrom(base, st, { kind: "pause", names: [], sandboxId: id, memory: cap.memory, vmState: cap.vmState, disk: up?.layer ?? null, tools: this.toolsRef(txn, base, st) });
      txn.publish(m);
      report = { snapshotId: m.id, changedMemoryBytes: cap.changedBytes, bytesWritten: cap.bytesWritten + (up?.bytes ?? 0), pauseMs, totalMs: Math.round(performance.now() - t0) };
    } catch (e) {
      txn.abort();
      // still running: the orchestrator decides (it kills a sandbox whose pause failed)
      if (!stopped) await vm.resume().catch(() => {});
      throw e;
    }
    this.lastCapture = report;
    this.log.info({ sandboxId: id, ...report }, "sandbox paused");
    rmSync(st.workDir, { recursive: true, force: true });
    await this.o.net.release(id).catch((e) => this.log.warn({ sandboxId: id, err: e }, "slot release after pause failed"));
    this.unuse(base.id, id);
    if (st.bootSnapshot) this.unuse(st.bootSnapshot.id, id);
    this.dropOwned(base, id);
    return { ...st, rootDisk: "", vmmPid: undefined, paused: m.id, bootSnapshot: undefined } satisfies VmState;
  }

  async resume(spec: RuntimeStartSpec, state: Record<string, unknown>, opts: { memory: boolean } = { memory: true }): Promise<RuntimeSandbox> {
    this.starting++;
    try {
      const st = parseVmState(spec.id, state);
      const m = st.paused ? this.repo.find(st.paused) : undefined;
      if (!m) throw new OrchestratorError("orchestrator.snapshot_missing", `snapshot of sandbox ${spec.id} is missing`, { sandboxId: spec.id, snapshot: st.paused ?? null });
      // what it started from, never the template's current build (a rebuild or delete changes
      // nothing for it); memory: false boots the snapshot's disk (a filesystem-only pause has nothing else)
      return await this.launch(spec, m, st.template, st, !opts.memory);
    } finally {
      this.startEnded();
    }
  }

  private startEnded(): void {
    this.starting--;
    this.lastStartEnd = performance.now();
  }

  /** Resolves once no sandbox start has been in progress for `quietMs` (checked every 50 ms). */
  private async quiet(quietMs: number, signal: AbortSignal): Promise<void> {
    while (this.starting > 0 || performance.now() - this.lastStartEnd < quietMs) {
      if (signal.aborted) throw signal.reason;
      await Bun.sleep(Math.max(10, Math.min(50, quietMs)));
    }
  }

  /**
   * Make one VM of the restore pool: a restore of `ctx.base` under a fresh sandbox id (slot with
   * the default policy, fresh disk upper, envd initialised without a token), then one command as
   * the SDK runs it (`/bin/bash -l -c true` as the default user), then paused.
   * @returns its sandbox id
   * @throws whatever the restore throws (nothing of the VM is left then)
   */
  private async prepare(ctx: PoolCtx, signal: AbortSignal): Promise<string> {
    const id = newSandboxId();
    const spec: RuntimeStartSpec = {
      id,
      template: snapshotTemplateInfo(ctx.base),
      cpuCount: ctx.base.vm.vcpus,
      memoryMB: ctx.base.vm.memoryMiB,
      envVars: {},
      envdAccessToken: null,
      allowInternetAccess: null,
      network: null,
      volumes: [],
      signal,
      onLog: (line) => this.logSinks.get(id)?.(line),
    };
    const r = await this.launch(spec, ctx.base, ctx.from, null, false, true);
    const vm = this.vms.get(id)!;
    try {
      const user = ctx.from.boot?.user ?? this.o.defaultUser;
      const w = await runInGuest(`http://${r.endpoint.host}:${ENVD_PORT}`, { cmd: "/bin/bash", args: ["-l", "-c", "true"], user }, signal);
      if (w.exitCode !== 0) throw new OrchestratorError("orchestrator.runtime_failed", `warm-up command of a restore pool VM exited ${w.exitCode}: ${w.output.slice(-300)}`, { sandboxId: id });
      await vm.pause();
    } catch (e) {
      await this.discardPrepared(id, r.runtimeState as VmState);
      throw e;
    }
    this.prepared.set(id, { state: r.runtimeState as VmState, from: ctx.from, host: r.endpoint.host });
    void vm.exited.then(() => {
      if (this.pool.has(id)) this.pool.lost(id);
    });
    return id;
  }

  /**
   * Start sandbox `spec.id` on the VM the restore pool prepared under that id: its policy set,
   * the VM continued, envd re-initialised with the create's token, env vars, clock and host name.
   * @throws OrchestratorError / NetError / VmmError (the caller discards the VM)
   */
  private async adopt(spec: RuntimeStartSpec, base: SnapshotManifest): Promise<RuntimeSandbox> {
    const id = spec.id;
    const p = this.prepared.get(id);
    const vm = this.vms.get(id);
    if (!p || !vm) throw new OrchestratorError("orchestrator.runtime_failed", `restore pool VM ${id} is gone`, { sandboxId: id });
    const t: StartTimings = { verifyMs: 0, diskMs: 0, slotMs: 0, memoryMs: 0, vmmMs: 0, vmmSpawnMs: 0, envdMs: 0, healthMs: 0, initMs: 0, totalMs: 0, restored: true, pooled: true };
    const t0 = performance.now();
    if (spec.network !== null || spec.allowInternetAccess !== null) await this.o.net.updatePolicy(id, this.policyOf(spec));
    const t1 = performance.now();
    if (spec.onLog) this.logSinks.set(id, spec.onLog);
    await vm.resume();
    const t2 = performance.now();
    // the pooled envd has no token (it was initialised with none)
    const r = await this.ready(spec, vm, p.host, { ...p.state, envdToken: spec.envdAccessToken }, null, p.from.boot, t);
    this.prepared.delete(id);
    t.slotMs = Math.round(t1 - t0);
    t.vmmMs = Math.round(t2 - t1);
    t.envdMs = Math.round(performance.now() - t2);
    t.totalMs = Math.round(performance.now() - t0);
    this.lastStart = t;
    this.log.info({ sandboxId: id, base: base.id, ...t }, "sandbox started from the restore pool");
    return { ...r, lost: this.drivesLost(id) };
  }

  /**
   * Resolves with a reason when sandbox `id`'s root disk or one of its volume drives is removed
   * under the guest (the orchestrator then fails the sandbox); never when it has no disk export.
   */
  private drivesLost(id: string): Promise<string> {
    const disk = this.disks.get(id);
    const drives = [...(disk ? [disk] : []), ...(this.volumeDisks.get(id) ?? [])];
    return Promise.race(drives.map((d) => d.lost.then((why) => `${d === disk ? "root disk" : `volume drive ${d.id}`} lost: ${why}`)));
  }

  /** Stop and remove a VM of the restore pool (prepared or failed to prepare). Never throws. */
  private async discardPrepared(id: string, state?: VmState): Promise<void> {
    const st = this.prepared.get(id)?.state ?? state;
    this.prepared.delete(id);
    this.logSinks.delete(id);
    await this.teardown(id, this.vms.get(id), this.o.net.slotOf(id) !== undefined, true);
    if (st) this.unuse(st.base, id);
  }

  /**
   * Filesystem-only pause: the disk (upper + volumes) is all that is kept. The VMM is stopped
   * without a capture (the orchestrator has flushed the guest's filesystems and unmounted the
   * volumes), the upper is committed as a layer of a disk-only `pause` snapshot on top of the
   * base, and a resume cold-boots from it.
   */
  private async pauseDiskOnly(id: string, st: VmState, vm: VmHandle, signal: AbortSignal): Promise<Record<string, unknown>> {
    const base = this.baseOfState(id, st);
    if (signal.aborted) throw signal.reason;
    const t0 = performance.now();
    await vm.stop();
    this.vms.delete(id);
    await this.closeDisk(id);
    const pauseMs = Math.round(performance.now() - t0);
    const txn = this.repo.begin();
    let m: SnapshotManifest;
    try {
      const up = await commitUpper(txn, layerPaths(this.repo, base.disk.layers), upperPaths(st.workDir));
      m = this.manifestFrom(base, st, { kind: "pause", names: [], sandboxId: id, memory: null, vmState: null, disk: up?.layer ?? null, tools: undefined });
      txn.publish(m);
      this.lastCapture = { snapshotId: m.id, changedMemoryBytes: 0, bytesWritten: up?.bytes ?? 0, pauseMs, totalMs: Math.round(performance.now() - t0) };
    } catch (e) {
      // the VM is gone but the upper is still in the work dir: the sandbox can be killed, never half-committed
      txn.abort();
      throw e;
    }
    this.log.info({ sandboxId: id, ...this.lastCapture }, "sandbox paused (filesystem only)");
    rmSync(st.workDir, { recursive: true, force: true });
    await this.o.net.release(id).catch((e) => this.log.warn({ sandboxId: id, err: e }, "slot release after pause failed"));
    this.unuse(base.id, id);
    if (st.bootSnapshot) this.unuse(st.bootSnapshot.id, id);
    this.dropOwned(base, id);
    return { ...st, rootDisk: "", vmmPid: undefined, paused: m.id, bootSnapshot: undefined } satisfies VmState;
  }

  async kill(id: string, state: Record<string, unknown> | null): Promise<void> {
    const vm = this.vms.get(id);
    await this.teardown(id, vm, this.o.net.slotOf(id) !== undefined, true);
    let st: VmState | null = null;
    try {
      st = state === null ? null : parseVmState(id, state);
    } catch (e) {
      // a record of another version: what it names cannot be trusted, but the sandbox still goes
      this.log.warn({ sandboxId: id, err: e }, "kill of a sandbox whose runtime state does not parse");
    }
    if (!vm && st?.vmmPid) {
      // a VMM without handle (should not happen after start-up reaping): kill by pid
      try {
        process.kill(st.vmmPid, "SIGKILL");
      } catch {
        // gone
      }
    }
    if (st?.paused) this.repo.remove(st.paused);
    if (st?.bootSnapshot) this.unuse(st.bootSnapshot.id, id);
    if (st?.base) {
      this.unuse(st.base, id);
      const base = this.repo.find(st.base);
      if (base) this.dropOwned(base, id);
    }
    this.gc();
  }

  /**
   * Commit a snapshot of a sandbox: a running one is paused for the capture and resumes (same
   * VM, same id); a paused one's pause snapshot is committed again under the new kind and names.
   * @throws OrchestratorError `orchestrator.bad_request` (bad name; a sandbox with volumes),
   *   SnapshotError, VmmError
   */
  async snapshot(id: string, state: Record<string, unknown>, req: SnapshotRequest, signal: AbortSignal): Promise<SnapshotInfo> {
    const st = parseVmState(id, state);
    if (req.name !== undefined && !SNAPSHOT_NAME_RE.test(req.name)) {
      throw new OrchestratorError("orchestrator.bad_request", `invalid snapshot name ${JSON.stringify(req.name)}`, { name: req.name });
    }
    if (req.volumes > 0) {
      throw new OrchestratorError("orchestrator.bad_request", `sandbox ${id} has volumes attached: its snapshots could only be restored with the same volumes, which belong to one writer`, { sandboxId: id });
    }
    const names = req.name ? [req.name] : [];
    if (st.paused) {
      const p = this.repo.find(st.paused);
      if (!p) throw new OrchestratorError("orchestrator.snapshot_missing", `snapshot of sandbox ${id} is missing`, { sandboxId: id });
      const m: SnapshotManifest = { ...p, id: newSnapshotId(), kind: req.kind, names, createdAt: new Date().toISOString() };
      // its layers may have left the layer cache since the pause
      const hold = await this.o.snapshots.remote?.acquire(layersOf(p));
      try {
        this.repo.begin().publish(m);
      } finally {
        hold?.release();
      }
      return snapshotInfo(m);
    }
    const vm = this.vms.get(id);
    if (!vm) throw new OrchestratorError("orchestrator.runtime_failed", `no VM handle for sandbox ${id}`, { sandboxId: id });
    const base = this.baseOfState(id, st);
    const t0 = performance.now();
    const txn = this.repo.begin();
    try {
      if (signal.aborted) throw signal.reason;
      await vm.pause();
      let cap, up, pauseMs;
      try {
        cap = await captureVm(vm, txn, st.memoryMiB * MiB, this.parentMemory(base, st));
        up = await commitUpper(txn, layerPaths(this.repo, base.disk.layers), upperPaths(st.workDir));
      } finally {
        await vm.resume();
        pauseMs = Math.round(performance.now() - t0);
      }
      const m = this.manifestFrom(base, st, { kind: req.kind, names, sandboxId: id, memory: cap.memory, vmState: cap.vmState, disk: up?.layer ?? null, tools: this.toolsRef(txn, base, st) });
      txn.publish(m);
      this.lastCapture = { snapshotId: m.id, changedMemoryBytes: cap.changedBytes, bytesWritten: cap.bytesWritten + (up?.bytes ?? 0), pauseMs, totalMs: Math.round(performance.now() - t0) };
      this.log.info({ sandboxId: id, ...this.lastCapture, kind: req.kind }, "sandbox snapshot committed");
      return snapshotInfo(m);
    } catch (e) {
      txn.abort();
      throw e;
    }
  }

  /** Every user snapshot (kind `user`), oldest first. */
  listSnapshots(): SnapshotInfo[] {
    return this.repo.list().filter((m) => m.kind === "user").map(snapshotInfo);
  }

  /**
   * Delete a user or fork snapshot by id or name. One still used by a running sandbox is hidden
   * at once and removed when its last user stops (its files stay until then).
   * @returns false when no such snapshot exists
   */
  async deleteSnapshot(ref: string): Promise<boolean> {
    const m = this.findSnapshot(ref, ["user", "fork"]);
    if (!m) return false;
    if (this.users.get(m.id)?.size) this.repo.tombstone(m.id);
    else {
      this.repo.remove(m.id);
      this.gc();
    }
    return true;
  }

  /**
   * Metrics come from envd's `GET /metrics` inside the guest, not from the VMM process on the
   * host: the guest's view is what E2B reports (vCPUs, CPU busy share, MemTotal - MemAvailable,
   * the root filesystem's use), while the host only sees QEMU's RSS (pages ever touched, never
   * given back) and its CPU time (under TCG mostly translation work), neither of which is what
   * the sandbox's programs use.
   */
  async sampleMetrics(t: RuntimeMetricsTarget, signal: AbortSignal): Promise<Omit<SandboxMetricsSample, "at">> {
    return fetchEnvdMetrics(envdBase(t), t.envdAccessToken, signal);
  }

  guestVolumeFiles(t: RuntimeMetricsTarget, mountPath: string): GuestVolumeFiles {
    const v = this.requireVolumes();
    return new GuestVolumeFiles(envdBase(t), t.envdAccessToken, mountPath, v.o.defaults, v.o.maxListEntries, v.o.guestOpTimeoutMs);
  }

  async quiesce(t: RuntimeMetricsTarget, volumes: VolumeMount[], timeoutMs: number): Promise<void> {
    const paths = volumes.filter((m) => !m.readOnly).map((m) => m.path);
    const r = await execInGuest(envdBase(t), t.envdAccessToken, "/bin/sh", ["-c", QUIESCE_SCRIPT, "sh", ...paths], timeoutMs);
    if (r.exitCode !== 0) throw new OrchestratorError("orchestrator.volume_busy", `a volume of sandbox ${t.id} stayed mounted (busy); it was synced`, { sandboxId: t.id, stderr: r.stderr });
  }

  checkNetwork(network: Record<string, unknown> | null, allowInternetAccess: boolean | null): void {
    this.policyOf({ network, allowInternetAccess } as RuntimeStartSpec);
  }

  async updateNetwork(id: string, _state: Record<string, unknown>, policy: Record<string, unknown>): Promise<void> {
    await this.o.net.updatePolicy(id, this.parsePolicy(policy));
  }

  async reap(known: RuntimeKnownSandbox[]): Promise<ReapReport> {
    const stoppedVms = await reapLeftovers(this.o.runtimePath);
    const removed: string[] = reapStaleMounts([join(this.o.homePath, "sandboxes")]).map((m) => `mount ${m}`);
    // nothing runs now: sandboxes' work dirs are gone with their VMs (a paused sandbox's state is
    // its snapshot)
    const dir = join(this.o.homePath, "sandboxes");
    for (const name of safeReaddir(dir)) {
      rmSync(join(dir, name), { recursive: true, force: true });
      removed.push(`sandboxes/${name}`);
    }
    const keep = pauseSnapshotsToKeep(known, this.log);
    const dropped: string[] = [];
    for (const m of this.repo.list({ hidden: true })) {
      const kept = keep.get(m.source.sandboxId ?? "");
      const orphanPause = m.kind === "pause" && kept !== "all" && kept !== m.id;
      // fork checkpoints and tombstoned snapshots only lived for sandboxes that ran
      if (orphanPause || m.kind === "fork" || this.repo.isTombstoned(m.id)) {
        this.repo.remove(m.id);
        dropped.push(...layersOf(m).map((l) => l.digest));
        removed.push(`snapshot ${m.id} (${m.kind})`);
      }
    }
    // boot snapshots of another kernel, tools drive or driver: no VM of this node runs from them now
    try {
      for (const m of staleBootSnapshots(this.repo, { driver: this.o.driver.name, kernelKey: this.kernelKeys.of(this.o.kernelPath()), toolsImage: this.o.toolsImage() })) {
        this.repo.remove(m.id);
        dropped.push(...layersOf(m).map((l) => l.digest));
        removed.push(`snapshot ${m.id} (boot, stale)`);
      }
    } catch (e) {
      this.log.warn({ err: e }, "stale boot snapshots not looked for (no kernel or tools drive yet)");
    }
    // nothing restores yet: their layers go now unless another snapshot names them (no grace)
    const gc = this.repo.gc([], Date.now(), dropped);
    removed.push(...gc.layers.map((l) => `layer ${l}`), ...gc.staging.map((s) => `staging ${s}`));
    return { stoppedVms, removed };
  }

  beginShutdown(): void {
    this.poolClosed ??= this.pool.close();
    this.o.disks.beginShutdown();
  }

  private poolClosed: Promise<void> | undefined;

  async close(): Promise<void> {
    clearInterval(this.gcTimer);
    await (this.poolClosed ??= this.pool.close());
    // a boot snapshot being made stops (its VM and slot are freed by the build itself)
    this.bootSnapshotAbort.abort();
    await Promise.all([...this.bootSnapshotBuilds.values()]);
    // pushes in progress finish (bounded); the VMs are not needed for that
    await this.o.snapshots.remote?.close();
    for (const [id, vm] of this.vms) await vm.stop().catch((e) => this.log.error({ sandboxId: id, err: e }, "stop at close failed"));
    this.vms.clear();
    for (const id of new Set([...this.disks.keys(), ...this.volumeDisks.keys()])) await this.closeDisk(id);
    await this.o.snapshots.images.closeAll();
    await this.volumes?.close();
    await this.o.disks.close().catch((e) => this.log.error({ err: e }, "disk daemon shutdown failed"));
    await this.o.onClose?.();
  }

  // ---- internals ----

  private workDir(id: string): string {
    return join(this.o.homePath, "sandboxes", id);
  }

  private parsePolicy(p: Record<string, unknown>) {
    try {
      return parseEgressPolicy(p);
    } catch (e) {
      throw new OrchestratorError("orchestrator.bad_request", (e as Error).message, { network: p }, { cause: e });
    }
  }

  private policyOf(spec: RuntimeStartSpec) {
    return this.parsePolicy({ ...(spec.network ?? {}), ...(spec.allowInternetAccess === null ? {} : { allow_internet_access: spec.allowInternetAccess }) });
  }

  /** A snapshot of one of `kinds` by id, or the newest visible one carrying `ref` as a name (with or without `:tag`). */
  private findSnapshot(ref: string, kinds: SnapshotManifest["kind"][]): SnapshotManifest | undefined {
    const id = ref.endsWith(":default") ? ref.slice(0, -8) : ref;
    let m: SnapshotManifest | undefined;
    try {
      m = this.repo.find(id);
    } catch (e) {
      this.log.warn({ err: e, ref }, "unreadable snapshot manifest");
    }
    if (m && kinds.includes(m.kind) && !this.repo.isTombstoned(m.id)) return m;
    const named = this.repo.list().filter((x) => kinds.includes(x.kind) && x.names.some((n) => n === ref || n.replace(/:[^:/]*$/, "") === ref));
    return named.at(-1);
  }

  /**
   * The snapshot a new sandbox of template-or-snapshot `ref` starts from, with what it records
   * of its template (layer files, process defaults of catalog builds). A catalog template boots
   * build `buildID` when that is a ready build of it (what the create resolved, e.g. a tag's),
   * else the build its name boots.
   * @throws OrchestratorError `orchestrator.template_not_found` (404)
   */
  private async baseFor(ref: string, buildID = ""): Promise<{ base: SnapshotManifest } & StartedFrom> {
    const t = this.catalog.find(ref);
    if (t && !t.legacy) {
      let b: BuildRecord;
      try {
        b = t.builds.find((x) => x.buildID === buildID && x.status === "ready") ?? this.catalog.readyBuild(t.templateID).build;
      } catch (e) {
        throw new OrchestratorError("orchestrator.template_not_found", (e as TemplateError).message, { template: ref });
      }
      const boot = b.boot!;
      const tpl: ResolvedTemplate = {
        name: t.templateID,
        dir: this.o.homePath,
        rootfsPath: "",
        rootLayers: boot.layers.map((l) => join(this.o.homePath, l)),
        bootArgs: boot.bootArgs,
        diskBytes: boot.diskBytes,
        buildKey: b.buildID,
        snapshot: boot.snapshot ?? null,
        cpuCount: b.cpuCount || null,
        memoryMB: b.memoryMB || null,
      };
      const { envs, workdir, user, startCmd, readyCmd } = boot;
      return { base: await this.templateBase(tpl), rootLayers: tpl.rootLayers, boot: { envs, workdir, user, startCmd, readyCmd } };
    }
    if (t) {
      const tpl = resolveTemplate(this.o.homePath, t.templateID);
      return { base: await this.templateBase(tpl), rootLayers: tpl.rootLayers, boot: null };
    }
    const m = this.findSnapshot(ref, ["user", "template", "fork"]) ?? (await this.remoteSnapshot(ref));
    if (m) return { base: m, rootLayers: [], boot: null };
    throw new OrchestratorError("orchestrator.template_not_found", `template or snapshot '${ref}' not found`, { template: ref });
  }

  /** A template's committed snapshot, or its disk-only one (made on first use). */
  private async templateBase(tpl: ResolvedTemplate): Promise<SnapshotManifest> {
    if (tpl.snapshot) {
      const m = this.repo.find(tpl.snapshot) ?? (await this.o.snapshots.remote?.open(tpl.snapshot));
      if (m) return m;
      this.log.warn({ template: tpl.name, snapshot: tpl.snapshot }, "template snapshot missing from the repository: cold boot");
    }
    return this.diskOnlyTemplateSnapshot(tpl);
  }

  /** The disk-only snapshot of a template without a committed one (its layers, hard-linked in), made once. */
  private async diskOnlyTemplateSnapshot(tpl: ResolvedTemplate): Promise<SnapshotManifest> {
    const have = this.repo.list({ hidden: true }).find((m) => m.kind === "template" && m.memory === null && m.source.templateId === tpl.name && m.templateBuild === tpl.buildKey);
    if (have && !this.repo.isTombstoned(have.id)) return have;
    const txn = this.repo.begin();
    try {
      let layers: LayerRef[];
      if (tpl.rootLayers.length > 0) layers = tpl.rootLayers.map((p) => txn.addLayer(p, { keepSource: true }));
      else {
        const out = txn.file("rootfs.layer");
        await importSparse(tpl.rootfsPath, out);
        layers = [txn.addLayer(out)];
      }
      const vm = {
        driver: this.o.driver.name,
        vcpus: tpl.cpuCount ?? this.o.defaultCpuCount,
        memoryMiB: tpl.memoryMB ?? this.o.defaultMemoryMB,
        kernelKey: this.kernelKeys.of(this.o.kernelPath()),
        mac: "",
      };
      const m = templateManifest(tpl, vm, layers, null);
      txn.publish(m);
      return m;
    } catch (e) {
      txn.abort();
      throw e;
    }
  }

  /** A snapshot this node lacks, by id, from the object store (its manifest adopted here). */
  private async remoteSnapshot(ref: string): Promise<SnapshotManifest | undefined> {
    const remote = this.o.snapshots.remote;
    if (!remote || !SNAPSHOT_ID_RE.test(ref)) return undefined;
    const m = await remote.open(ref);
    return m && m.kind !== "pause" ? m : undefined;
  }

  private baseOfState(id: string, st: VmState): SnapshotManifest {
    const base = this.repo.find(st.base);
    if (!base) throw new OrchestratorError("orchestrator.snapshot_missing", `base snapshot ${st.base} of sandbox ${id} is missing`, { sandboxId: id, snapshot: st.base });
    return base;
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
    return {
      version: 1,
      id: newSnapshotId(),
      kind: c.kind,
      parent: base.id,
      createdAt: new Date().toISOString(),
      names: c.names,
      source: { sandboxId: c.sandboxId, templateId: base.source.templateId },
      vm: { ...base.vm, vcpus: st.vcpus, memoryMiB: st.memoryMiB, mac: st.mac, kernelKey: st.bootSnapshot ? st.bootSnapshot.kernelKey : st.coldBoot ? this.kernelKeys.of(this.o.kernelPath()) : base.vm.kernelKey },
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

  /**
   * Start sandbox `spec.id` from snapshot `base`: a restore of its memory image, or a cold boot
   * from its disk (no image; or a create asking for another VM shape or for volumes, which a
   * restore cannot give). `resumed` is the state of a paused sandbox being resumed; `coldBoot`
   * boots from the disk even when the snapshot has memory (a resume with `memory: false`).
   */
  private async launch(spec: RuntimeStartSpec, base: SnapshotManifest, from: StartedFrom, resumed: VmState | null, coldBoot = false, forPool = false): Promise<RuntimeSandbox> {
    const id = spec.id;
    const boot = from.boot;
    const workDir = this.workDir(id);
    const restore = !coldBoot && base.memory !== null && base.vmState !== null && (resumed !== null || (spec.volumes.length === 0 && spec.cpuCount === base.vm.vcpus && spec.memoryMB === base.vm.memoryMiB));
    const t: StartTimings = { verifyMs: 0, diskMs: 0, slotMs: 0, memoryMs: 0, vmmMs: 0, vmmSpawnMs: 0, envdMs: 0, healthMs: 0, initMs: 0, totalMs: 0, restored: restore, pooled: false };
    const t0 = performance.now();
    let mark = t0;
    const lap = () => {
      const now = performance.now();
      const d = Math.round(now - mark);
      mark = now;
      return d;
    };
    let slotTaken = false;
    let vm: VmHandle | undefined;
    let lease: ImageLease | undefined;
    let hold: LayerHold | undefined;
    let step = "verify layers";
    let bootSnap: SnapshotManifest | undefined;
    let bootHold: LayerHold | undefined;
    try {
      const layers = restore ? layersOf(base) : base.disk.layers;
      // with an object store: the missing ones are fetched (digest-checked) and held while the VM runs
      hold = await this.o.snapshots.remote?.acquire(layers);
      for (const l of layers) this.repo.verifyLayer(l);
      t.verifyMs = lap();
      step = "serve disk";
      // a fresh upper every time: the base holds everything the sandbox wrote before
      rmSync(workDir, { recursive: true, force: true });
      const disk = await this.o.disks.rootDisk({ id, lowers: layerPaths(this.repo, base.disk.layers), sandboxDir: workDir, virtualSize: base.disk.virtualSize });
      this.disks.set(id, disk);
      step = "serve volumes";
      const volumeDrives = await this.serveVolumes(id, workDir, spec.volumes);
      t.diskMs = lap();
      step = "allocate slot";
      const slot = await this.o.net.allocate(this.policyOf(spec), id);
      slotTaken = true;
      t.slotMs = lap();
      // a cold boot without kernel arguments of its own (which a restored kernel would not see)
      // restores the boot snapshot of its shape and number of volumes (made now if missing)
      const bootable = !restore && keptBootArgs(base.vm.bootArgs).length === 0 && this.o.bootSnapshots === true;
      bootSnap = bootable ? await this.bootSnapshotFor({ vcpus: spec.cpuCount, memoryMiB: spec.memoryMB, volumeSlots: volumeDrives.length }, spec.signal) : undefined;
      if (bootSnap) {
        // held from here: a stale sweep or the layer cache must not take it while the VM starts
        this.use(bootSnap.id, id);
        bootHold = await this.o.snapshots.remote?.acquire(layersOf(bootSnap));
      }
      t.fromBootSnapshot = bootSnap !== undefined;
      let mac = restore ? base.vm.mac : bootSnap ? bootSnap.vm.mac : slot.mac;
      // a restore attaches the tools drive the snapshot's VM booted through (its copy in the
      // repository: the guest has it mounted); a cold boot the node's current one
      let toolsImage = restore ? (base.tools ? this.repo.layerPath(base.tools) : undefined) : bootSnap ? this.repo.layerPath(bootSnap.tools!) : this.o.toolsImage();
      const specWith = (tools: string | undefined, guestMac: string): VmSpec => {
        const drivesAndArgs = tools ? toolsBoot(tools, disk.path, base.vm.bootArgs) : { drives: [{ id: "root", path: disk.path, readOnly: false, isRoot: true }], bootArgs: base.vm.bootArgs };
        return {
          id,
          workDir,
          kernelPath: this.o.kernelPath(),
          bootArgs: drivesAndArgs.bootArgs,
          vcpus: restore ? base.vm.vcpus : spec.cpuCount,
          memoryMiB: restore ? base.vm.memoryMiB : spec.memoryMB,
          // the same devices in the same order as when the snapshot was taken
          drives: [...drivesAndArgs.drives, ...volumeDrives],
          // every slot gives the guest the same address and gateway: a restored guest keeps its config
          net: { ...netSpec(slot), mac: guestMac },
          onConsoleLine: consoleSink(spec),
        };
      };
      const vmSpec = specWith(toolsImage, mac);
      if (restore) {
        step = "serve memory image";
        lease = await this.o.snapshots.images.acquire(memoryKey(base), layerPaths(this.repo, base.memory!.layers));
        t.memoryMs = lap();
        step = "restore VM";
        vm = await this.o.driver.restore(vmSpec, { statePath: this.repo.layerPath(base.vmState!), memPath: lease.path, kind: "full" }, { resume: true });
        // the image may go only once the VMM that maps it is gone
        const l = lease;
        void vm.exited.then(() => l.release()).catch((e) => this.log.error({ sandboxId: id, err: e }, "memory image release failed"));
      } else {
        if (bootSnap) {
          step = "restore boot snapshot";
          const envd = `http://${guestAddress(slot, ENVD_PORT).host}:${ENVD_PORT}`;
          const signal = AbortSignal.any([spec.signal, AbortSignal.timeout(BOOT_SNAPSHOT_TIMEOUT_MS)]);
          const snap = bootSnap;
          try {
            vm = await restoreBootSnapshot({ repo: this.repo, images: this.o.snapshots.images, driver: this.o.driver, envdPollMs: this.o.envdPollMs, log: this.log }, snap, vmSpec, envd, signal);
            const h = bootHold;
            void vm.exited.then(() => h?.release());
          } catch (e) {
            if (spec.signal.aborted) throw e;
            // the boot snapshot only saves time: this start boots; unless the sandbox's own disk
            // would not mount, so do the shape's next ones for a while
            if (!(e instanceof RootMountError)) this.bootSnapshotFailed(snap);
            this.log.warn({ sandboxId: id, bootSnapshot: snap.id, err: e }, "restoring the boot snapshot failed: booting");
            this.unuse(snap.id, id);
            bootHold?.release();
            bootHold = undefined;
            bootSnap = undefined;
            t.fromBootSnapshot = false;
            mac = slot.mac;
            toolsImage = this.o.toolsImage();
          }
        }
        if (!vm) {
          step = "boot VM";
          vm = await this.o.driver.boot(specWith(toolsImage, mac));
        }
      }
      this.vms.set(id, vm);
      const h = hold;
      void vm.exited.then(() => h?.release());
      this.use(base.id, id);
      t.vmmMs = lap();
      t.vmmSpawnMs = vm.spawnMs ?? 0;
      step = "envd health and /init";
      const state: VmState = {
        workDir,
        rootDisk: disk.path,
        mac,
        base: base.id,
        coldBoot: !restore,
        ...(bootSnap ? { bootSnapshot: { id: bootSnap.id, memory: bootSnap.memory!.layers, tools: bootSnap.tools!, kernelKey: bootSnap.vm.kernelKey } } : {}),
        ...(toolsImage ? { toolsImage } : {}),
        vmmPid: vm.pid,
        vcpus: vmSpec.vcpus,
        memoryMiB: vmSpec.memoryMiB,
        envdToken: spec.envdAccessToken,
        envdVersion: base.envd.version,
        template: from,
      };
      const host = guestAddress(slot, ENVD_PORT).host;
      // a restored envd holds the token it had at snapshot time; a booted one has none
      const r = await this.ready(spec, vm, host, state, restore ? base.envd.accessToken : null, boot, t);
      // a restored guest has its volumes mounted already; a booted one (a create, or a resume
      // from the disk) mounts them (from a boot snapshot: its drives re-probed by the restore)
      if (spec.volumes.length > 0 && !restore) await mountVolumesInGuest(`http://${host}:${ENVD_PORT}`, spec.envdAccessToken, spec.volumes, this.guestOpTimeoutMs());
      if (!restore && (boot?.startCmd || boot?.readyCmd)) await this.startTemplateProcess(spec, `http://${host}:${ENVD_PORT}`, boot);
      t.envdMs = lap();
      t.totalMs = Math.round(performance.now() - t0);
      if (!forPool) this.lastStart = t;
      this.log.info({ sandboxId: id, base: base.id, ...t, ...(bootSnap ? { bootSnapshot: bootSnap.id } : {}) }, forPool ? "restore pool VM restored" : restore ? "sandbox restored" : bootSnap ? "sandbox booted from a boot snapshot" : "sandbox booted");
      if (restore && WARM_KINDS.includes(base.kind)) await this.keepWarm(base);
      return { ...r, lost: this.drivesLost(id) };
    } catch (e) {
      this.log.error({ sandboxId: id, base: base.id, step, err: e }, `start failed at step: ${step}`);
      if (bootSnap) this.unuse(bootSnap.id, id);
      // with a VM, its exit releases the hold
      if (!vm) bootHold?.release();
      if (vm) this.unuse(base.id, id);
      else {
        await lease?.release().catch(() => {});
        hold?.release();
      }
      await this.teardown(id, vm, slotTaken, true);
      throw e;
    }
  }

  /**
   * The current boot snapshot of `shape`, made first when there is none (one build per shape at
   * a time; concurrent cold boots of the shape wait for it). Undefined when making or restoring
   * the shape's last failed less than BOOT_SNAPSHOT_RETRY_MS ago (the caller boots).
   */
  private async bootSnapshotFor(shape: BootShape, signal: AbortSignal): Promise<SnapshotManifest | undefined> {
    // Firecracker's snapshot load re-opens the drives at the paths they had when the snapshot was
    // taken (its API has no drive override), and a boot snapshot's placeholder is gone by then
    if (this.o.driver.name !== "qemu") return undefined;
    const keys = { driver: this.o.driver.name, kernelKey: this.kernelKeys.of(this.o.kernelPath()), toolsImage: this.o.toolsImage() };
    const key = bootShapeKey(shape);
    const failedAt = this.bootSnapshotFailures.get(key);
    if (failedAt !== undefined && Date.now() - failedAt < BOOT_SNAPSHOT_RETRY_MS) return undefined;
    const have = findBootSnapshot(this.repo, shape, keys);
    if (have) {
      // its memory image stays served between cold boots (and build VMs): each restore then
      // finds its pages in the page cache instead of reading them through the export again
      await this.keepWarm(have);
      return have;
    }
    let build = this.bootSnapshotBuilds.get(key);
    if (!build) {
      const deps = { repo: this.repo, driver: this.o.driver, net: this.o.net, kernelPath: this.o.kernelPath(), workRoot: join(this.o.homePath, "sandboxes"), envdPollMs: this.o.envdPollMs, bootTimeoutMs: BOOT_SNAPSHOT_TIMEOUT_MS, log: this.log };
      build = makeBootSnapshot(deps, `bootsnap-${key}`.slice(0, 40), shape, keys, this.bootSnapshotAbort.signal)
        .then(
          (m) => {
            this.dropStaleBootSnapshots(keys);
            return m;
          },
          (e) => {
            if (!this.bootSnapshotAbort.signal.aborted) {
              this.bootSnapshotFailures.set(key, Date.now());
              this.log.warn({ err: e, ...shape }, "making a boot snapshot failed: cold boots of this shape boot the kernel");
            }
            return undefined;
          },
        )
        .finally(() => this.bootSnapshotBuilds.delete(key));
      this.bootSnapshotBuilds.set(key, build);
    }
    // each waiter stops waiting when its own start is abandoned; the build goes on for the others
    if (signal.aborted) return undefined;
    let onAbort = () => {};
    const abandoned = new Promise<undefined>((r) => (onAbort = () => r(undefined)));
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      return await Promise.race([build, abandoned]);
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }

  /** Tombstone (in use) or remove boot snapshots of another kernel, tools drive or driver than `keys`. */
  private dropStaleBootSnapshots(keys: BootKeys): void {
    try {
      for (const old of staleBootSnapshots(this.repo, keys)) {
        if (this.users.get(old.id)?.size) this.repo.tombstone(old.id);
        else this.repo.remove(old.id);
      }
    } catch (e) {
      this.log.warn({ err: e }, "stale boot snapshots not removed");
    }
  }

  /** Restoring `snap` failed: cold boots of its shape boot for BOOT_SNAPSHOT_RETRY_MS. */
  private bootSnapshotFailed(snap: SnapshotManifest): void {
    this.bootSnapshotFailures.set(bootShapeKey(bootShapeOf(snap)), Date.now());
  }

  /**
   * Cold-boot half of a template's start command: run it in the background as the template's
   * user and poll its ready command (`readyProbe`) every `readyPollMs` until it exits 0.
   * @throws OrchestratorError `orchestrator.template_not_ready` when the start command exits
   *   non-zero or the ready command does not pass within `readyTimeoutMs`.
   */
  private async startTemplateProcess(spec: RuntimeStartSpec, base: string, boot: NonNullable<BootDefaults>): Promise<void> {
    const c = { user: boot.user, cwd: boot.workdir, envs: { ...boot.envs, ...spec.envVars }, accessToken: spec.envdAccessToken };
    let failed: string | null = null;
    // the start command's output stream is watched until the ready check passes, then dropped
    // (envd keeps the process running when its stream ends)
    const watch = new AbortController();
    try {
      if (boot.startCmd) {
        void runInGuest(base, { ...c, cmd: "/bin/sh", args: ["-c", boot.startCmd] }, AbortSignal.any([spec.signal, watch.signal])).then(
          (r) => (failed = r.exitCode !== 0 ? `exited with code ${r.exitCode}: ${r.output.slice(-500)}` : failed),
          () => {},
        );
      }
      if (!boot.readyCmd) return;
      const r = await waitReady({
        readyCmd: boot.readyCmd,
        run: (script, timeoutMs) => runInGuest(base, { ...c, ...probeCommand(script) }, AbortSignal.any([spec.signal, AbortSignal.timeout(timeoutMs)])),
        startFailure: () => failed,
        timeoutMs: this.o.readyTimeoutMs,
        pollMs: this.o.readyPollMs,
        probeTimeoutMs: this.o.readyProbeTimeoutMs,
        signal: spec.signal,
      });
      if (r.startFailure) throw new OrchestratorError("orchestrator.template_not_ready", `template start command ${r.startFailure}`, { sandboxId: spec.id });
      if (!r.ok) throw new OrchestratorError("orchestrator.template_not_ready", `template ready command did not pass within ${this.o.readyTimeoutMs} ms: ${boot.readyCmd}`, { sandboxId: spec.id });
    } finally {
      watch.abort();
    }
  }

  /**
   * Wait for envd, init it (token, template's user, workdir and env under the request's, clock,
   * host name), and describe the running sandbox.
   */
  private async ready(spec: RuntimeStartSpec, vm: VmHandle, host: string, state: VmState, currentToken: string | null, boot: BootDefaults, t?: StartTimings): Promise<RuntimeSandbox> {
    const base = `http://${host}:${ENVD_PORT}`;
    const t0 = performance.now();
    await waitEnvdHealthy(base, this.o.envdPollMs, spec.signal, vm.exited);
    const t1 = performance.now();
    const user = boot?.user ?? this.o.defaultUser;
    const version = await initEnvd(
      base,
      {
        // "" clears a token a restored envd still holds from its snapshot
        accessToken: spec.envdAccessToken ?? "",
        envVars: { ...(boot?.envs ?? {}), ...spec.envVars },
        defaultUser: user,
        defaultWorkdir: boot?.workdir ?? `/home/${user}`,
        timestamp: new Date().toISOString(),
        hostname: spec.id,
      },
      currentToken,
      spec.signal,
    );
    if (t) {
      t.healthMs = Math.round(t1 - t0);
      t.initMs = Math.round(performance.now() - t1);
    }
    const st: VmState = { ...state, envdVersion: version ?? state.envdVersion ?? ENVD_VERSION };
    return { endpoint: { host }, runtimeState: { ...st }, envdVersion: st.envdVersion, exited: vm.exited };
  }

  private use(snapshotId: string, sandboxId: string): void {
    let s = this.users.get(snapshotId);
    if (!s) this.users.set(snapshotId, (s = new Set()));
    s.add(sandboxId);
  }

  /** `sandboxId` no longer runs from `snapshotId`; a tombstoned snapshot without users goes. */
  private unuse(snapshotId: string, sandboxId: string): void {
    const s = this.users.get(snapshotId);
    s?.delete(sandboxId);
    if (s && s.size === 0) this.users.delete(snapshotId);
    if (!this.users.has(snapshotId) && this.repo.isTombstoned(snapshotId)) {
      this.repo.remove(snapshotId);
      this.gc();
    }
  }

  /** Remove `base` when it is sandbox `id`'s own pause snapshot (superseded or dead with it). */
  private dropOwned(base: SnapshotManifest, id: string): void {
    if (base.kind === "pause" && base.source.sandboxId === id && !this.users.get(base.id)?.size) {
      this.repo.remove(base.id);
      this.gc();
    }
  }

  private gc(): void {
    this.coolStale();
    this.pool.poke();
    try {
      this.repo.gc();
    } catch (e) {
      this.log.error({ err: e }, "snapshot gc failed");
    }
  }

  /**
   * Keep the memory image of `base` (a template or user snapshot just restored from) open after
   * its last sandbox (`[snapshot] warm_images`), and let go of images whose snapshot is gone.
   * Never throws: a failure only costs the next restore its warm page cache.
   */
  private async keepWarm(base: SnapshotManifest): Promise<void> {
    this.coolStale();
    const key = memoryKey(base);
    try {
      if (await this.o.snapshots.images.keepWarm(key, layerPaths(this.repo, base.memory!.layers))) this.warmFor.set(key, base.id);
    } catch (e) {
      this.log.warn({ snapshot: base.id, err: e }, "memory image not kept warm");
    }
    for (const k of [...this.warmFor.keys()]) if (!this.o.snapshots.images.warmKeys().includes(k)) this.warmFor.delete(k);
  }

  /** Release the warm hold on memory images whose snapshot was deleted or replaced (tombstoned). */
  private coolStale(): void {
    for (const [key, id] of [...this.warmFor]) {
      let gone = true;
      try {
        gone = this.repo.find(id) === undefined || this.repo.isTombstoned(id);
      } catch (e) {
        this.log.warn({ snapshot: id, err: e }, "unreadable manifest: its memory image is not kept warm");
      }
      if (!gone) continue;
      this.warmFor.delete(key);
      this.o.snapshots.images.cool(key);
    }
  }

  /** Stop serving the root disk and the volume drives of sandbox `id`. */
  private async closeDisk(id: string): Promise<void> {
    const d = this.disks.get(id);
    this.disks.delete(id);
    await d?.close().catch((e) => this.log.error({ sandboxId: id, err: e }, "disk export close failed"));
    for (const v of this.volumeDisks.get(id) ?? []) await v.close().catch((e) => this.log.error({ sandboxId: id, err: e }, "volume export close failed"));
    this.volumeDisks.delete(id);
  }

  /** Serve the volume drives of sandbox `id` (kept for closeDisk). */
  private async serveVolumes(id: string, workDir: string, mounts: VolumeMount[]): Promise<DriveSpec[]> {
    if (mounts.length === 0) return [];
    const { disks, drives } = await serveVolumeDrives(id, workDir, mounts, this.requireVolumes().o);
    this.volumeDisks.set(id, disks);
    return drives;
  }

  private requireVolumes(): VmVolumes {
    if (!this.volumes) throw new OrchestratorError("orchestrator.bad_request", "this runtime has no volume support configured", {});
    return this.volumes;
  }

  private guestOpTimeoutMs(): number {
    return this.requireVolumes().o.guestOpTimeoutMs;
  }

  /** Stop the VM, stop serving its disk, release the slot, and (when `dropDisk`) delete the work dir. Never throws. */
  private async teardown(id: string, vm: VmHandle | undefined, releaseSlot: boolean, dropDisk: boolean): Promise<void> {
    if (vm) await vm.stop().catch((e) => this.log.error({ sandboxId: id, err: e }, "VM stop failed"));
    this.vms.delete(id);
    await this.closeDisk(id);
    if (releaseSlot) await this.o.net.release(id).catch((e) => this.log.error({ sandboxId: id, err: e }, "slot release failed"));
    if (dropDisk) rmSync(this.workDir(id), { recursive: true, force: true });
  }
}

function safeReaddir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}


/** A snapshot as the API lists it. */
export function snapshotInfo(m: SnapshotManifest): SnapshotInfo {
  return { snapshotID: m.id, names: m.names, sandboxID: m.source.sandboxId, templateID: m.source.templateId, createdAt: Date.parse(m.createdAt) };
}

/** A snapshot seen as a template a sandbox can be created from. */
function snapshotTemplateInfo(m: SnapshotManifest): TemplateInfo {
  const created = Date.parse(m.createdAt);
  return {
    templateID: m.id,
    aliases: m.names,
    cpuCount: m.vm.vcpus,
    memoryMB: m.vm.memoryMiB,
    diskSizeMB: Math.floor(m.disk.virtualSize / MiB),
    envdVersion: m.envd.version,
    createdAt: created,
    updatedAt: created,
    buildID: m.id,
    buildStatus: "ready",
  };
}

/**
 * Which pause snapshots the start-up reap keeps, per sandbox id: a paused sandbox keeps the one
 * its stored state names; a paused sandbox whose stored state does not parse (or names none)
 * keeps every pause snapshot of its own, "all", and is logged: a damaged record never costs the
 * data it may point to (its resume then fails with `orchestrator.bad_runtime_state`). Sandboxes
 * that are not paused keep none.
 */
function pauseSnapshotsToKeep(known: RuntimeKnownSandbox[], log: Logger): Map<string, string | "all"> {
  const keep = new Map<string, string | "all">();
  for (const k of known) {
    if (k.state !== "paused") continue;
    let paused: string | undefined;
    try {
      paused = parseVmState(k.id, k.runtimeState).paused;
    } catch (e) {
      log.error({ sandboxId: k.id, err: e }, "paused sandbox with an unreadable runtime state: its pause snapshots are kept");
      keep.set(k.id, "all");
      continue;
    }
    if (paused === undefined) log.error({ sandboxId: k.id }, "paused sandbox whose runtime state names no pause snapshot: its pause snapshots are kept");
    keep.set(k.id, paused ?? "all");
  }
  return keep;
}
