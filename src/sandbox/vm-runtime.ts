/**
 * The real SandboxRuntime: a sandbox is a microVM (QEMU or Firecracker via src/vmm) in its own
 * network slot (src/net), booted from a template of the local store (src/template) on a
 * private copy of the template's root image, with envd (guest port 49983) initialised over the
 * slot's host address.
 *
 * Root disk: a template with overlaybd layers gets the storage daemon's export (template lowers
 * + a fresh upper in `sandboxes/<id>/upper/`, served as `sandboxes/<id>/mnt/root.img` by the
 * node's disk daemon); a template with only a raw image gets a private sparse copy (`sandboxes/<id>/root.img`).
 * Layout under the data dir: `sandboxes/<id>/` (disk, VMM work files) and `snapshots/<id>/`
 * (state + memory of a paused sandbox). Pause = VM pause, snapshot, stop the VMM, stop serving
 * the disk (the upper stays), release the slot. Resume = serve the disk again, new slot, restore
 * with the same MAC, re-init envd (same token).
 */
import { parseVmState, type VmState } from "./vm-state.ts";
import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { ENVD_PORT, ENVD_VERSION } from "../envd/version.ts";
import { guestAddress, netSpec, parseEgressPolicy, type NetworkManager } from "../net/index.ts";
import { logger } from "../observability/log.ts";
import { reapStaleMounts, upperPaths, type DiskExport, type DiskService } from "../storage/daemon/index.ts";
import { resolveTemplate, shownBuild, TemplateCatalog, TemplateError, waitReady, type BootSpec, type BuildRecord, type BuildVmLauncher, type ResolvedTemplate, type TemplateRecord } from "../template/index.ts";
import { toolsBoot } from "../tools/index.ts";
import { reapLeftovers, type VmHandle, type VmmDriver } from "../vmm/index.ts";
import { consoleLogLine } from "./console-lines.ts";
import { fetchEnvdMetrics, initEnvd, runInGuest, waitEnvdHealthy } from "./envd-client.ts";
import { bootBuildVm, type BuildVmTimeouts } from "./build-vm.ts";
import { GuestVolumeFiles } from "./guest-volume-files.ts";
import { execInGuest } from "./guest-exec.ts";
import { mountVolumesInGuest, QUIESCE_SCRIPT, serveVolumeDrives, VmVolumes, type VmVolumesOptions } from "./volumes.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { copyRootImage } from "./root-disk.ts";
import type { ReapReport, RuntimeKnownSandbox, RuntimeMetricsTarget, RuntimeSandbox, RuntimeStartSpec, SandboxRuntime } from "../orchestrator/runtime.ts";
import type { SandboxMetricsSample, TemplateInfo, VolumeMount } from "../orchestrator/types.ts";
import type { DriveSpec } from "../vmm/index.ts";

export interface VmRuntimeOptions {
  homePath: string;
  runtimePath: string;
  kernelPath: () => string;
  /** The tools drive image new VMs boot through (src/tools; read again for every boot). */
  toolsImage: () => string;
  driver: VmmDriver;
  net: NetworkManager;
  defaultCpuCount: number;
  defaultMemoryMB: number;
  envdPollMs: number;
  /** User envd runs commands as by default (templates create `user`, uid 1000). */
  defaultUser: string;
  /** The node's disk daemon (serves overlaybd root disks and volume drives); closed by close(). */
  disks: DiskService;
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
}

/** A template resolved for booting: disk + what runs in it. */
interface BootTemplate extends ResolvedTemplate {
  boot: Pick<BootSpec, "envs" | "workdir" | "user" | "startCmd" | "readyCmd"> | null;
}

/**
 * Names for the next snapshot in `snapDir`: `vm-<n>.state` / `vm-<n>.mem` with n one past the
 * previous snapshot's number (`prev`, from the sandbox's state; the first is 1), so they never
 * equal the files a resumed VM still maps.
 */
export function snapshotFiles(snapDir: string, prev: { statePath: string } | undefined): { statePath: string; memPath: string; kind: "full" } {
  const m = prev ? /vm-(\d+)\.state$/.exec(prev.statePath) : null;
  const n = m ? Number(m[1]) + 1 : 1;
  return { statePath: join(snapDir, `vm-${n}.state`), memPath: join(snapDir, `vm-${n}.mem`), kind: "full" };
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
  private readonly log: Logger = logger("orchestrator.vm");
  /** The template catalog of this home (built templates and build-base ones). */
  readonly catalog: TemplateCatalog;
  readonly volumes?: VmVolumes;

  constructor(private readonly o: VmRuntimeOptions) {
    this.name = `vm:${o.driver.name}`;
    this.catalog = new TemplateCatalog(o.homePath, (path, err) => this.log.warn({ path, err: err.message }, "unreadable template record skipped"));
    if (o.volumes) this.volumes = new VmVolumes(o.volumes);
  }

  async listTemplates(): Promise<TemplateInfo[]> {
    return this.catalog.list().map((t) => this.templateInfo(t, shownBuild(t)));
  }

  /** A template by id, alias or `name:tag`, with `buildID` the build that name boots; null when none is ready. */
  async resolveTemplate(ref: string): Promise<TemplateInfo | null> {
    try {
      const { template, build } = this.catalog.readyBuild(ref);
      return this.templateInfo(template, build);
    } catch (e) {
      if (e instanceof TemplateError) return null;
      throw e;
    }
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

  /** Boots template build VMs (internal sandboxes outside the orchestrator's table). */
  buildVmLauncher(timeouts: BuildVmTimeouts): BuildVmLauncher {
    return { boot: (spec) => bootBuildVm(this.o, spec, timeouts) };
  }

  /**
   * The disk and process defaults of template `id` (catalog build or build-base manifest): build
   * `buildID` when it is a ready build of it (what the create resolved, e.g. a tag's), else the
   * build its name boots.
   * @throws OrchestratorError `orchestrator.template_not_found` (404) when it has no ready build.
   */
  private bootTemplate(id: string, buildID = ""): BootTemplate {
    const t = this.catalog.find(id);
    if (t && !t.legacy) {
      let boot: BootSpec;
      try {
        boot = (t.builds.find((b) => b.buildID === buildID && b.status === "ready") ?? this.catalog.readyBuild(t.templateID).build).boot!;
      } catch (e) {
        throw new OrchestratorError("orchestrator.template_not_found", (e as TemplateError).message, { template: id });
      }
      return {
        name: t.templateID,
        dir: this.o.homePath,
        rootfsPath: "",
        rootLayers: boot.layers.map((l) => join(this.o.homePath, l)),
        bootArgs: boot.bootArgs,
        diskBytes: boot.diskBytes,
        boot,
      };
    }
    return { ...resolveTemplate(this.o.homePath, id), boot: null };
  }

  async start(spec: RuntimeStartSpec): Promise<RuntimeSandbox> {
    return this.boot(spec, this.bootTemplate(spec.template.templateID, spec.template.buildID), false);
  }

  /**
   * Boot the sandbox's VM from its kernel on its disk (a new sandbox, or the cold boot of a
   * paused one: the disk's upper and the volumes are kept, everything else starts afresh), wait
   * for envd, init it, mount the volumes, start the template's process.
   * @param tpl what to boot: a new sandbox's template build, or what a paused one recorded at its start
   * @param keepDisk on failure, keep the work dir (a paused sandbox's disk) instead of deleting it
   */
  private async boot(spec: RuntimeStartSpec, tpl: BootTemplate, keepDisk: boolean): Promise<RuntimeSandbox> {
    const workDir = this.workDir(spec.id);
    const policy = this.policyOf(spec);
    let slotTaken = false;
    let vm: VmHandle | undefined;
    const t0 = performance.now();
    const ms = (t: number) => Math.round(performance.now() - t);
    try {
      const { path: rootDisk, kind: diskKind } = await this.serveDisk(spec.id, tpl, workDir, spec.signal);
      const volumeDrives = await this.serveVolumes(spec.id, workDir, spec.volumes);
      const tDisk = ms(t0);
      const slot = await this.o.net.allocate(policy, spec.id);
      slotTaken = true;
      const tSlot = ms(t0);
      const toolsImage = this.o.toolsImage();
      const boot = toolsBoot(toolsImage, rootDisk, tpl.bootArgs);
      vm = await this.o.driver.boot({
        id: spec.id,
        workDir,
        kernelPath: this.o.kernelPath(),
        bootArgs: `${boot.bootArgs} aenv.hostname=${spec.id.slice(0, 12)}`,
        vcpus: spec.cpuCount,
        memoryMiB: spec.memoryMB,
        drives: [...boot.drives, ...volumeDrives],
        net: netSpec(slot),
        onConsoleLine: consoleSink(spec),
      });
      this.vms.set(spec.id, vm);
      const state: VmState = { workDir, rootDisk, mac: slot.mac, diskKind, toolsImage, vmmPid: vm.pid, template: tpl };
      const tVmm = ms(t0);
      const host = guestAddress(slot, ENVD_PORT).host;
      const r = await this.ready(spec, vm, host, state, null, tpl.boot);
      if (spec.volumes.length > 0) await mountVolumesInGuest(`http://${host}:${ENVD_PORT}`, spec.envdAccessToken, spec.volumes, this.guestOpTimeoutMs());
      if (tpl.boot?.startCmd || tpl.boot?.readyCmd) await this.startTemplateProcess(spec, `http://${r.endpoint.host}:${ENVD_PORT}`, tpl.boot);
      this.log.info({ sandboxId: spec.id, diskMs: tDisk, slotMs: tSlot - tDisk, vmmMs: tVmm - tSlot, envdMs: ms(t0) - tVmm, totalMs: ms(t0) }, "sandbox VM started");
      return r;
    } catch (e) {
      await this.teardown(spec.id, vm, slotTaken, !keepDisk);
      throw e;
    }
  }

  async pause(id: string, state: Record<string, unknown>, signal: AbortSignal, opts: { memory: boolean } = { memory: true }): Promise<Record<string, unknown>> {
    const st = parseVmState(id, state);
    const vm = this.vms.get(id);
    if (!vm) throw new OrchestratorError("orchestrator.runtime_failed", `no VM handle for sandbox ${id}`, { sandboxId: id });
    if (!opts.memory) {
      // filesystem-only: the disk (upper + volumes) is the snapshot; no RAM or device state
      if (signal.aborted) throw signal.reason;
      await vm.stop();
      this.vms.delete(id);
      rmSync(this.snapshotDir(id), { recursive: true, force: true });
      await this.closeDisk(id);
      await this.o.net.release(id).catch((e) => this.log.warn({ sandboxId: id, err: e }, "slot release after pause failed"));
      return { ...st, vmmPid: undefined, snapshot: undefined } satisfies VmState;
    }
    const snapDir = this.snapshotDir(id);
    mkdirSync(snapDir, { recursive: true });
    // A fresh pair of names per pause: a VM resumed from an earlier snapshot still maps that
    // snapshot's memory file as its RAM (copy-on-write), so the new snapshot must not overwrite
    // or delete it before the VMM is stopped.
    const files = snapshotFiles(snapDir, st.snapshot);
    try {
      if (signal.aborted) throw signal.reason;
      await vm.pause();
      await vm.snapshot(files);
      await vm.stop();
    } catch (e) {
      for (const p of [files.statePath, files.memPath]) rmSync(p, { force: true });
      throw e;
    }
    this.vms.delete(id);
    // the VMM is gone: files of older snapshots are no longer mapped
    for (const name of readdirSync(snapDir)) {
      const p = join(snapDir, name);
      if (p !== files.statePath && p !== files.memPath) rmSync(p, { recursive: true, force: true });
    }
    await this.closeDisk(id);
    await this.o.net.release(id).catch((e) => this.log.warn({ sandboxId: id, err: e }, "slot release after pause failed"));
    return { ...st, vmmPid: undefined, snapshot: { statePath: files.statePath, memPath: files.memPath } } satisfies VmState;
  }

  async resume(spec: RuntimeStartSpec, state: Record<string, unknown>, opts: { memory: boolean } = { memory: true }): Promise<RuntimeSandbox> {
    const st = parseVmState(spec.id, state);
    if (!opts.memory) {
      if (st.diskKind === "copy" ? !existsSync(st.rootDisk) : !existsSync(upperPaths(st.workDir).data)) {
        throw new OrchestratorError("orchestrator.snapshot_missing", `the disk of sandbox ${spec.id} is missing`, { sandboxId: spec.id, workDir: st.workDir });
      }
      // the upper sits on the layers it started with, not on the template's current build
      const r = await this.boot(spec, st.template ?? this.bootTemplate(spec.template.templateID), true);
      // a memory snapshot left from an earlier pause is stale now
      rmSync(this.snapshotDir(spec.id), { recursive: true, force: true });
      return r;
    }
    if (!st.snapshot || !existsSync(st.snapshot.statePath) || (st.diskKind === "copy" && !existsSync(st.rootDisk))) {
      throw new OrchestratorError("orchestrator.snapshot_missing", `snapshot of sandbox ${spec.id} is missing`, { sandboxId: spec.id, snapshot: st.snapshot ?? null });
    }
    const tpl = st.template ?? this.bootTemplate(spec.template.templateID);
    let slotTaken = false;
    let vm: VmHandle | undefined;
    let step = "serve disk";
    try {
      const served = await this.serveDisk(spec.id, tpl, st.workDir, spec.signal);
      if (served.path !== st.rootDisk) {
        throw new OrchestratorError("orchestrator.runtime_failed", `sandbox ${spec.id}: root disk moved from ${st.rootDisk} to ${served.path}`, { sandboxId: spec.id });
      }
      step = "serve volumes";
      const volumeDrives = await this.serveVolumes(spec.id, st.workDir, spec.volumes);
      step = "allocate slot";
      const slot = await this.o.net.allocate(this.policyOf(spec), spec.id);
      slotTaken = true;
      step = "restore VM";
      // the same devices as at boot: the tools drive it booted through (if any), then its disk
      const boot: { drives: DriveSpec[]; bootArgs: string } = st.toolsImage
        ? toolsBoot(st.toolsImage, st.rootDisk, tpl.bootArgs)
        : { drives: [{ id: "root", path: st.rootDisk, readOnly: false, isRoot: true }], bootArgs: tpl.bootArgs };
      vm = await this.o.driver.restore(
        {
          id: spec.id,
          workDir: st.workDir,
          kernelPath: this.o.kernelPath(),
          bootArgs: `${boot.bootArgs} aenv.hostname=${spec.id.slice(0, 12)}`,
          vcpus: spec.cpuCount,
          memoryMiB: spec.memoryMB,
          drives: [...boot.drives, ...volumeDrives],
          // the guest keeps the MAC it had; every slot gives the guest the same address
          net: { ...netSpec(slot), mac: st.mac },
          onConsoleLine: consoleSink(spec),
        },
        { statePath: st.snapshot.statePath, memPath: st.snapshot.memPath, kind: "full" },
        { resume: true },
      );
      this.vms.set(spec.id, vm);
      step = "envd health and /init";
      return await this.ready(spec, vm, guestAddress(slot, ENVD_PORT).host, { ...st, vmmPid: vm.pid }, spec.envdAccessToken, tpl.boot);
    } catch (e) {
      this.log.error({ sandboxId: spec.id, step, err: e }, `resume failed at step: ${step}`);
      // keep the snapshot and disk: the sandbox stays paused
      await this.teardown(spec.id, vm, slotTaken, false);
      throw e;
    }
  }

  async kill(id: string, state: Record<string, unknown> | null): Promise<void> {
    const vm = this.vms.get(id);
    await this.teardown(id, vm, this.o.net.slotOf(id) !== undefined, true);
    const st = state === null ? null : parseVmState(id, state);
    if (!vm && st?.vmmPid) {
      // a VMM without handle (should not happen after start-up reaping): kill by pid
      try {
        process.kill(st.vmmPid, "SIGKILL");
      } catch {
        // gone
      }
    }
    rmSync(this.snapshotDir(id), { recursive: true, force: true });
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
    const keep = new Set(known.filter((k) => k.state === "paused").map((k) => k.id));
    for (const sub of ["sandboxes", "snapshots"]) {
      const dir = join(this.o.homePath, sub);
      if (!existsSync(dir)) continue;
      for (const name of readdirSync(dir)) {
        if (keep.has(name) || !statSync(join(dir, name)).isDirectory()) continue;
        rmSync(join(dir, name), { recursive: true, force: true });
        removed.push(`${sub}/${name}`);
      }
    }
    return { stoppedVms, removed };
  }

  beginShutdown(): void {
    this.o.disks.beginShutdown();
  }

  async close(): Promise<void> {
    for (const [id, vm] of this.vms) await vm.stop().catch((e) => this.log.error({ sandboxId: id, err: e }, "stop at close failed"));
    this.vms.clear();
    for (const id of new Set([...this.disks.keys(), ...this.volumeDisks.keys()])) await this.closeDisk(id);
    await this.volumes?.close();
    await this.o.disks.close().catch((e) => this.log.error({ err: e }, "disk daemon shutdown failed"));
    await this.o.onClose?.();
  }

  // ---- internals ----

  private workDir(id: string): string {
    return join(this.o.homePath, "sandboxes", id);
  }

  private snapshotDir(id: string): string {
    return join(this.o.homePath, "snapshots", id);
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

  /**
   * Cold-boot half of a template's start command: run it in the background as the template's
   * user and poll its ready command (`readyProbe`) every `readyPollMs` until it exits 0.
   * @throws OrchestratorError `orchestrator.template_not_ready` when the start command exits
   *   non-zero or the ready command does not pass within `readyTimeoutMs`.
   */
  private async startTemplateProcess(spec: RuntimeStartSpec, base: string, boot: NonNullable<BootTemplate["boot"]>): Promise<void> {
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
        run: (script, timeoutMs) => runInGuest(base, { ...c, cmd: "/bin/sh", args: ["-c", script] }, AbortSignal.any([spec.signal, AbortSignal.timeout(timeoutMs)])),
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

  /** Wait for envd, init it (template's user, workdir and env under the request's), and describe the running sandbox. */
  private async ready(spec: RuntimeStartSpec, vm: VmHandle, host: string, state: VmState, currentToken: string | null = null, boot: BootTemplate["boot"] = null): Promise<RuntimeSandbox> {
    const base = `http://${host}:${ENVD_PORT}`;
    await waitEnvdHealthy(base, this.o.envdPollMs, spec.signal, vm.exited);
    const user = boot?.user ?? this.o.defaultUser;
    const version = await initEnvd(
      base,
      {
        ...(spec.envdAccessToken ? { accessToken: spec.envdAccessToken } : {}),
        envVars: { ...(boot?.envs ?? {}), ...spec.envVars },
        defaultUser: user,
        defaultWorkdir: boot?.workdir ?? `/home/${user}`,
        timestamp: new Date().toISOString(),
      },
      currentToken,
      spec.signal,
    );
    return { endpoint: { host }, runtimeState: { ...state }, envdVersion: version ?? ENVD_VERSION, exited: vm.exited };
  }

  /** Serve (overlaybd) or copy (raw) the root disk of sandbox `id` in `workDir`. */
  private async serveDisk(id: string, tpl: ResolvedTemplate, workDir: string, signal: AbortSignal): Promise<{ path: string; kind: VmState["diskKind"] }> {
    if (tpl.rootLayers.length === 0) return { path: await copyRootImage(tpl.rootfsPath, workDir, signal), kind: "copy" };
    const d = await this.o.disks.rootDisk({ id, lowers: tpl.rootLayers, sandboxDir: workDir, virtualSize: tpl.diskBytes });
    this.disks.set(id, d);
    return { path: d.path, kind: "overlaybd" };
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
