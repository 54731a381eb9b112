/**
 * The real SandboxRuntime: a sandbox is a microVM (QEMU or Firecracker via src/vmm) in its own
 * network slot (src/net), started from a committed snapshot (src/snapshot), with envd (guest
 * port 49983) initialised over the slot's host address. This is the front; the work is done by
 * its parts:
 * - base-resolver.ts: templates and the snapshot a sandbox starts from;
 * - launcher.ts: a start (restore of a memory image, or a cold boot: of a boot snapshot,
 *   boot-snapshots.ts, or of the kernel) with running-vms.ts recording what each VM holds;
 * - captures.ts: pauses (with memory or filesystem only) and snapshots;
 * - pooled-vms.ts: VMs restored ahead for creates (the restore pool);
 * - snapshot-users.ts, warm-images.ts: which snapshots VMs run from, memory images kept served;
 * - adoption.ts, reaper.ts: start-up recovery: sandboxes a previous node left running are taken
 *   over (or their files kept), the rest reaped; `detach` leaves them running for the next node.
 * Snapshots outlive sandboxes; one still used by a running sandbox is tombstoned on delete and
 * removed when its last user stops. Layout under the data dir: `sandboxes/<id>/` (upper, mount,
 * VMM work files) and the snapshot repository (`snapshots/` by default).
 */
import type { Logger } from "pino";
import { logger } from "../observability/log.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import type { GuestTarget, PreparedStarts, ReapReport, RuntimeKnownSandbox, RuntimeMetrics, RuntimeNetwork, RuntimeSandbox, RuntimeSharedPauses, RuntimeStartSpec, SandboxRuntime } from "../orchestrator/runtime.ts";
import type { TemplateInfo, VolumeMount } from "../orchestrator/types.ts";
import { TemplateCatalog, type BuildVmLauncher } from "../template/index.ts";
import { BaseResolver } from "./base-resolver.ts";
import { BootSnapshots } from "./boot-snapshots.ts";
import { buildVmLauncher } from "./build-launcher.ts";
import type { BuildVmTimeouts } from "./build-vm.ts";
import { KernelKeys } from "./capture.ts";
import { Captures } from "./captures.ts";
import { parseNetworkPolicy, sandboxPolicy } from "./egress.ts";
import { fetchEnvdMetrics } from "./envd-client.ts";
import { execInGuest } from "./guest-exec.ts";
import { envdUrl } from "./guest-start.ts";
import { Launcher } from "./launcher.ts";
import type { VmRuntimeOptions } from "./options.ts";
import { PooledVms } from "./pooled-vms.ts";
import { recover } from "./adoption.ts";
import { RunningVms } from "./running-vms.ts";
import { SharedPauses } from "./shared-pauses.ts";
import { SnapshotUsers } from "./snapshot-users.ts";
import { StartActivity } from "./start-activity.ts";
import { VM_STATE_CODEC, type VmState } from "./vm-state.ts";
import { QUIESCE_SCRIPT, VmVolumes } from "./volumes.ts";
import { WarmImages } from "./warm-images.ts";

/**
 * The VM runtime: the SandboxRuntime port's core and its capabilities (snapshots, metrics,
 * volumes, network policy, prepared starts), each handed to the part that does it.
 */
export class VmRuntime implements SandboxRuntime<VmState> {
  readonly name: string;
  readonly state = VM_STATE_CODEC;
  /** The template catalog of this home (built templates and build-base ones). */
  readonly catalog: TemplateCatalog;
  readonly volumes?: VmVolumes;
  /** Snapshots: pauses and captures of running VMs, listed and deleted (captures.ts). */
  readonly snapshots: Captures;
  /**
   * Metrics come from envd's `GET /metrics` inside the guest, not from the VMM process on the
   * host: the guest's view is what E2B reports (vCPUs, CPU busy share, MemTotal - MemAvailable,
   * the root filesystem's use), while the host only sees QEMU's RSS (pages ever touched, never
   * given back) and its CPU time (under TCG mostly translation work), neither of which is what
   * the sandbox's programs use.
   */
  readonly metrics: RuntimeMetrics = { sample: (t, signal) => fetchEnvdMetrics(envdUrl(t.endpoint.host), t.envdAccessToken, signal) };
  readonly network: RuntimeNetwork = {
    // the node's part too: rules' secrets exist, the interceptor is on, the node's limits
    check: (network, allowInternetAccess) => this.o.net.checkPolicy(sandboxPolicy(network, allowInternetAccess)),
    update: async (id, policy) => void (await this.o.net.updatePolicy(id, parseNetworkPolicy(policy))),
  };
  /** VMs of the restore pool (pooled-vms.ts), claimed by creates. */
  readonly prepared: PreparedStarts;
  /** Paused sandboxes moving between nodes through the object store (shared-pauses.ts); absent without `[snapshot.s3]`. */
  readonly shared?: RuntimeSharedPauses<VmState>;
  private readonly log: Logger = logger("orchestrator.vm");
  private readonly kernelKeys = new KernelKeys();
  private readonly resolver: BaseResolver;
  private readonly vms: RunningVms;
  private readonly users: SnapshotUsers;
  private readonly warm: WarmImages;
  private readonly boots: BootSnapshots;
  private readonly launcher: Launcher;
  private readonly pool: PooledVms;
  private readonly activity = new StartActivity();
  private gcTimer: ReturnType<typeof setInterval> | undefined;

  constructor(private readonly o: VmRuntimeOptions) {
    this.name = `vm:${o.driver.name}`;
    const log = this.log;
    this.catalog = new TemplateCatalog(o.homePath, (path, err) => log.warn({ path, err: err.message }, "unreadable template record skipped"));
    if (o.volumes) this.volumes = new VmVolumes(o.volumes);
    this.resolver = new BaseResolver(o, this.catalog, this.kernelKeys, log);
    this.vms = new RunningVms({ homePath: o.homePath, disks: o.disks, net: o.net, volumes: o.volumes, log });
    this.users = new SnapshotUsers(o.snapshots.repo, () => this.gc());
    this.warm = new WarmImages(o.snapshots.repo, o.snapshots.images, log);
    this.boots = new BootSnapshots(o, this.kernelKeys, this.users, this.warm, log);
    this.launcher = new Launcher(o, this.vms, this.users, this.boots, this.warm, log);
    this.snapshots = new Captures(o, this.vms, this.users, this.resolver, this.kernelKeys, log);
    this.pool = new PooledVms({ o, vms: this.vms, users: this.users, resolver: this.resolver, launcher: this.launcher, activity: this.activity, log });
    this.prepared = { claim: (template, shape) => this.pool.claim(template, shape) };
    if (o.snapshots.remote) this.shared = new SharedPauses(o.snapshots.remote, (id) => this.vms.workDir(id));
    if (o.snapshots.gcIntervalMs > 0) this.gcTimer = setInterval(() => this.gc(), o.snapshots.gcIntervalMs);
  }

  async listTemplates(): Promise<TemplateInfo[]> {
    return this.resolver.listTemplates();
  }

  resolveTemplate(ref: string): Promise<TemplateInfo | null> {
    return this.resolver.resolveTemplate(ref);
  }

  /**
   * Boots template build VMs (internal sandboxes outside the orchestrator's table) and keeps the
   * snapshots builds end in (build-snapshot.ts) in the node's repository.
   */
  buildVmLauncher(timeouts: BuildVmTimeouts): BuildVmLauncher {
    return buildVmLauncher({ o: this.o, boots: this.boots, users: this.users, kernelKeys: this.kernelKeys, gc: () => this.gc(), log: this.log }, timeouts);
  }

  async start(spec: RuntimeStartSpec): Promise<RuntimeSandbox<VmState>> {
    this.activity.begin();
    try {
      const { base, ...from } = await this.resolver.baseFor(spec.template.templateID, spec.template.buildID);
      return (await this.pool.start(spec, base)) ?? (await this.launcher.launch(spec, base, from, { kind: "create" }));
    } finally {
      this.activity.end();
    }
  }

  pause(id: string, state: VmState, signal: AbortSignal, opts: { memory: boolean; record?: Record<string, unknown> | null }): Promise<VmState> {
    return this.snapshots.pause(id, state, signal, opts.memory, opts.record);
  }

  async resume(spec: RuntimeStartSpec, st: VmState, opts: { memory: boolean }): Promise<RuntimeSandbox<VmState>> {
    this.activity.begin();
    try {
      const remote = this.o.snapshots.remote;
      // this node's copy, else the object store's (a repository emptied by hand; an adopted
      // snapshot is local already)
      const m = st.paused ? (this.o.snapshots.repo.find(st.paused) ?? (await remote?.open(st.paused))) : undefined;
      if (!m) throw new OrchestratorError("orchestrator.snapshot_missing", `snapshot of sandbox ${spec.id} is missing`, { sandboxId: spec.id, snapshot: st.paused ?? null });
      // what it started from, never the template's current build (a rebuild or delete changes
      // nothing for it); memory: false boots the snapshot's disk (a filesystem-only pause has nothing else)
      const started = await this.launcher.launch(spec, m, st.template, { kind: "resume", memory: opts.memory });
      // running again: the store keeps no pause snapshot of a running sandbox (no node may
      // resume it from there); not awaited, the object store's queue may be busy with pushes
      if (remote && m.kind === "pause") void remote.unpublish(m.id);
      return started;
    } finally {
      this.activity.end();
    }
  }

  async quiesce(t: GuestTarget, volumes: VolumeMount[], timeoutMs: number): Promise<void> {
    const paths = volumes.filter((m) => !m.readOnly).map((m) => m.path);
    const r = await execInGuest(envdUrl(t.endpoint.host), t.envdAccessToken, "/bin/sh", ["-c", QUIESCE_SCRIPT, "sh", ...paths], timeoutMs);
    if (r.exitCode !== 0) throw new OrchestratorError("orchestrator.volume_busy", `a volume of sandbox ${t.id} stayed mounted (busy); it was synced`, { sandboxId: t.id, stderr: r.stderr });
  }

  async kill(id: string, st: VmState | null): Promise<void> {
    const vm = this.vms.vm(id);
    await this.vms.teardown(id, true);
    if (!vm && st?.vmmPid) {
      // a VMM without handle (should not happen after start-up reaping): kill by pid
      try {
        process.kill(st.vmmPid, "SIGKILL");
      } catch {
        // gone
      }
    }
    if (st?.paused) this.o.snapshots.repo.remove(st.paused);
    if (st) this.users.leave(id, st.base, st.bootSnapshot?.id);
    this.gc();
  }

  recover(known: RuntimeKnownSandbox<VmState>[]): Promise<ReapReport<VmState>> {
    const reaper = { homePath: this.o.homePath, repo: this.o.snapshots.repo, bootKeys: () => this.boots.keys(), log: this.log };
    return recover({ o: this.o, vms: this.vms, users: this.users, captures: this.snapshots, resolver: this.resolver, reaper, log: this.log }, known);
  }

  beginShutdown(): void {
    void this.pool.close();
    this.o.disks.beginShutdown();
  }

  async close(): Promise<void> {
    clearInterval(this.gcTimer);
    await this.pool.close();
    // a boot snapshot being made stops (its VM and slot are freed by the build itself)
    await this.boots.close();
    // pushes in progress finish (bounded); the VMs are not needed for that
    await this.o.snapshots.remote?.close();
    await this.vms.closeAll();
    await this.o.snapshots.images.closeAll();
    await this.volumes?.close();
    await this.o.disks.close().catch((e) => this.log.error({ err: e }, "disk daemon shutdown failed"));
    await this.o.onClose?.();
  }

  /**
   * Leave every running sandbox to the next node (`shutdown_action = "detach"`): restore pool VMs
   * and VMs making boot snapshots are stopped, the node's own volume mounts closed, pushes to
   * the object store finished; then each sandbox VMM is let go (`VmHandle.detach`: its record
   * stays), the disk daemon left serving its exports, the network slots left as they are.
   */
  async detach(): Promise<void> {
    clearInterval(this.gcTimer);
    await this.pool.close();
    await this.boots.close();
    await this.o.snapshots.remote?.close();
    await this.volumes?.close();
    const ids = this.vms.ids();
    this.vms.detachAll();
    this.o.disks.detach();
    await this.o.net.detach();
    this.log.info({ sandboxes: ids.length }, "runtime detached: sandboxes left running for the next node");
  }

  /** Let go of warm images of deleted snapshots, let the pool sweep, collect unreferenced layers. */
  private gc(): void {
    this.warm.coolStale();
    this.pool.poke();
    try {
      this.o.snapshots.repo.gc();
    } catch (e) {
      this.log.error({ err: e }, "snapshot gc failed");
    }
  }
}
