/**
 * The VM runtime's side of the restore pool (restore-pool.ts has the bookkeeping): making a VM
 * ahead of a create (a restore under a fresh sandbox id, envd initialised without a token, one
 * command of the SDK's kind run, then paused), handing it to the create that claimed it (its
 * policy set, the VM continued, envd initialised again with the create's token, env vars, clock
 * and host name), and discarding VMs no create will take. Fills wait for a quiet moment after
 * the node's own starts (StartActivity).
 */
import type { Logger } from "pino";
import { newSandboxId } from "../orchestrator/ids.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import type { RuntimeSandbox, RuntimeStartSpec } from "../orchestrator/runtime.ts";
import type { SandboxLogLine, TemplateInfo } from "../orchestrator/types.ts";
import type { SnapshotManifest } from "../snapshot/index.ts";
import { snapshotTemplateInfo, type BaseResolver, type StartBase } from "./base-resolver.ts";
import { sandboxPolicy } from "./egress.ts";
import { runInGuest } from "./envd-client.ts";
import { envdUrl, initGuest } from "./guest-start.ts";
import { noTimings, type Launcher } from "./launcher.ts";
import type { VmRuntimeOptions } from "./options.ts";
import { RestorePool } from "./restore-pool.ts";
import type { RunningVms } from "./running-vms.ts";
import type { SnapshotUsers } from "./snapshot-users.ts";
import type { StartActivity } from "./start-activity.ts";
import type { StartedFrom, VmState } from "./vm-state.ts";
import { WARM_KINDS } from "./warm-images.ts";

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

/** What a pooled VM needs of the runtime's parts. */
export interface PooledVmsDeps {
  o: VmRuntimeOptions;
  vms: RunningVms;
  users: SnapshotUsers;
  resolver: BaseResolver;
  launcher: Launcher;
  activity: StartActivity;
  log: Logger;
}

/** The restore pool's VMs. */
export class PooledVms {
  readonly #pool: RestorePool<PoolCtx>;
  readonly #prepared = new Map<string, PreparedVm>();
  /** Log sinks of pooled VMs, set when a create takes one (its console lines go there from then on). */
  readonly #logSinks = new Map<string, (line: SandboxLogLine) => void>();
  #closed: Promise<void> | undefined;

  constructor(private readonly d: PooledVmsDeps) {
    const repo = d.o.snapshots.repo;
    this.#pool = new RestorePool<PoolCtx>(d.o.restorePool ?? { lowWatermark: 0, highWatermark: 0, snapshots: 0, claimTimeoutMs: 1, retryBackoffMs: 1, fillDelayMs: 0 }, {
      fill: (_id, ctx, signal) => this.prepare(ctx, signal),
      discard: (id) => this.discard(id),
      usable: (id) => {
        try {
          return repo.find(id) !== undefined && !repo.isTombstoned(id);
        } catch {
          return false;
        }
      },
      quiet: (ms, signal) => d.activity.quiet(ms, signal),
    });
  }

  /** Wake the pool so that it sweeps now (a snapshot may have been deleted). */
  poke(): void {
    this.#pool.poke();
  }

  /**
   * The id of a sandbox the pool prepared for a create of `template` in this shape (a VM of its
   * snapshot restored ahead, now reserved), or null when none is ready or the create cannot be a
   * restore (another VM shape, volumes, a snapshot without memory). Either way a restorable
   * create makes its snapshot one the pool keeps VMs of.
   */
  async claim(template: TemplateInfo, shape: { cpuCount: number; memoryMB: number; volumes: number }): Promise<string | null> {
    if (!this.#pool.enabled || shape.volumes > 0) return null;
    let r: StartBase;
    try {
      r = await this.d.resolver.baseFor(template.templateID, template.buildID);
    } catch {
      return null; // start() reports it
    }
    const { base } = r;
    if (!WARM_KINDS.includes(base.kind) || base.memory === null || base.vmState === null || shape.cpuCount !== base.vm.vcpus || shape.memoryMB !== base.vm.memoryMiB) return null;
    this.#pool.want(base.id, { base, from: { rootLayers: r.rootLayers, boot: r.boot } });
    return this.#pool.claim(base.id);
  }

  /**
   * Start sandbox `spec.id` on the VM the pool prepared under that id, when the create claimed
   * one of `base`. Null when it did not, or when that VM is unusable (it is discarded: the
   * caller starts the sandbox on request under the same id).
   */
  async start(spec: RuntimeStartSpec, base: SnapshotManifest): Promise<RuntimeSandbox<VmState> | null> {
    const pooledFrom = this.#pool.take(spec.id);
    if (pooledFrom === null) return null;
    if (pooledFrom === base.id) {
      try {
        return await this.continuePrepared(spec, base);
      } catch (e) {
        // the prepared VM is unusable: a restore on request instead, under the same id
        this.d.log.warn({ sandboxId: spec.id, base: base.id, err: e }, "restore pool VM not adopted: restoring on request");
      }
    }
    await this.discard(spec.id);
    return null;
  }

  /** Stop filling and discard every VM of the pool. Idempotent. */
  close(): Promise<void> {
    return (this.#closed ??= this.#pool.close());
  }

  /**
   * Sandbox `spec.id` on its prepared VM: its policy set, the VM continued, envd re-initialised
   * with the create's token, env vars, clock and host name.
   * @throws OrchestratorError / NetError / VmmError (the caller discards the VM)
   */
  private async continuePrepared(spec: RuntimeStartSpec, base: SnapshotManifest): Promise<RuntimeSandbox<VmState>> {
    const id = spec.id;
    const p = this.#prepared.get(id);
    const vm = this.d.vms.vm(id);
    if (!p || !vm) throw new OrchestratorError("orchestrator.runtime_failed", `restore pool VM ${id} is gone`, { sandboxId: id });
    const t = noTimings(true, true);
    const t0 = performance.now();
    if (spec.network !== null || spec.allowInternetAccess !== null) await this.d.o.net.updatePolicy(id, sandboxPolicy(spec.network, spec.allowInternetAccess));
    const t1 = performance.now();
    if (spec.onLog) this.#logSinks.set(id, spec.onLog);
    await vm.resume();
    const t2 = performance.now();
    // the pooled envd has no token (it was initialised with none)
    const g = await initGuest(spec, vm, p.host, { ...p.state, envdToken: spec.envdAccessToken }, null, p.from.boot, this.d.o);
    this.#prepared.delete(id);
    t.healthMs = g.timings.healthMs;
    t.initMs = g.timings.initMs;
    t.slotMs = Math.round(t1 - t0);
    t.vmmMs = Math.round(t2 - t1);
    t.envdMs = Math.round(performance.now() - t2);
    t.totalMs = Math.round(performance.now() - t0);
    this.d.log.info({ sandboxId: id, base: base.id, ...t }, "sandbox started from the restore pool");
    return { endpoint: { host: p.host }, runtimeState: g.state, envdVersion: g.state.envdVersion, exited: vm.exited, lost: this.d.vms.drivesLost(id) };
  }

  /**
   * Make one VM of the pool: a restore of `ctx.base` under a fresh sandbox id (slot with the
   * default policy, fresh disk upper, envd initialised without a token), then one command as the
   * SDK runs it (`/bin/bash -l -c true` as the default user), then paused.
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
      onLog: (line) => this.#logSinks.get(id)?.(line),
    };
    const r = await this.d.launcher.launch(spec, ctx.base, ctx.from, { kind: "pool" });
    const state = r.runtimeState;
    const vm = this.d.vms.vm(id)!;
    try {
      const user = ctx.from.boot?.user ?? this.d.o.defaultUser;
      const w = await runInGuest(envdUrl(r.endpoint.host), { cmd: "/bin/bash", args: ["-l", "-c", "true"], user }, signal);
      if (w.exitCode !== 0) throw new OrchestratorError("orchestrator.runtime_failed", `warm-up command of a restore pool VM exited ${w.exitCode}: ${w.output.slice(-300)}`, { sandboxId: id });
      await vm.pause();
    } catch (e) {
      await this.discard(id, state);
      throw e;
    }
    this.#prepared.set(id, { state, from: ctx.from, host: r.endpoint.host });
    void vm.exited.then(() => {
      if (this.#pool.has(id)) this.#pool.lost(id);
    });
    return id;
  }

  /** Stop and remove a VM of the pool (prepared or failed to prepare). Never throws. */
  private async discard(id: string, state?: VmState): Promise<void> {
    const st = this.#prepared.get(id)?.state ?? state;
    this.#prepared.delete(id);
    this.#logSinks.delete(id);
    await this.d.vms.teardown(id, true);
    if (st) this.d.users.unuse(st.base, id);
  }
}
