/**
 * Build the VM runtime from the node config: VMM driver (`[vm]`), disk daemon and network manager
 * (`[network]`; both started by the runtime's start-up recovery, which adopts what a previous node
 * left running), guest kernel, tools drive (the current one for every new VM), snapshot
 * repository and shared memory images (`[snapshot]`).
 */
import { ConfigError, type Config } from "../config/index.ts";
import type { Db } from "../db/index.ts";
import { netConfigFromConfig, NetworkManager } from "../net/index.ts";
import { openSecrets } from "../secrets/index.ts";
import { hostname } from "node:os";
import { diskConfig, DiskService } from "../storage/daemon/index.ts";
import { resolveTools } from "../tools/index.ts";
import { applyKsm, createDriver, resolveKernelPath } from "../vmm/index.ts";
import { logger } from "../observability/log.ts";
import { join } from "node:path";
import type { OrchestratorConfig } from "../orchestrator/config.ts";
import { openRepository, SharedImages, snapshotConfig } from "../snapshot/index.ts";
import { diskMemoryExporter } from "./memory-export.ts";
import type { VmRuntimeOptions } from "./options.ts";
import { VmRuntime } from "./vm-runtime.ts";
import type { RestorePoolOptions } from "./restore-pool.ts";

/**
 * The snapshot repository of the node (`[snapshot] path`, default `$home_path/snapshots`), with
 * `[snapshot.s3]` its object store (commits pushed, start-up sync begun, LRU layer cache), and its
 * shared memory images, served by the disk daemon `disks`.
 * @throws SnapshotError `snapshot.bad_config`
 */
export function snapshotServices(cfg: Config, disks: DiskService): VmRuntimeOptions["snapshots"] {
  const sc = snapshotConfig(cfg);
  const { repo, remote } = openRepository(sc, { evict: true });
  remote?.start();
  return {
    repo,
    images: new SharedImages(diskMemoryExporter(disks), { warmMax: sc.warmImages }),
    gcIntervalMs: sc.gcIntervalMs,
    remote,
  };
}

/**
 * `[pool.restore]` as the restore pool takes it (a claim lapses after the create timeout).
 * @throws ConfigError `config.bad_value` when low_watermark exceeds high_watermark
 */
export function restorePoolOptions(cfg: Config): RestorePoolOptions {
  const r = cfg.pool.restore;
  if (r.low_watermark > r.high_watermark) {
    throw new ConfigError("config.bad_value", `pool.restore.low_watermark = ${r.low_watermark} exceeds pool.restore.high_watermark ${r.high_watermark}`, { key: "pool.restore.low_watermark", value: r.low_watermark });
  }
  return {
    lowWatermark: r.low_watermark,
    highWatermark: r.high_watermark,
    snapshots: r.snapshots,
    claimTimeoutMs: cfg.orchestrator.create_timeout_ms,
    retryBackoffMs: r.retry_backoff_ms,
    fillDelayMs: r.fill_delay_ms,
  };
}

/**
 * Create the VM runtime. Nothing is reaped or started here: the orchestrator's start calls
 * `recover`, which adopts what a previous node left running (VMMs, the disk daemon and the
 * exports its sandboxes use, their slots), reaps the rest, then starts the disk daemon and the
 * network manager (adoption.ts).
 * @throws VmmError (bad driver config; `vmm.ksm_unavailable` for `[vm] ksm` without KSM, or "all"
 *   before Linux 6.7), KsmError `ksm.failed` (a KSM knob or the prctl refused), SnapshotError /
 *   ConfigError (bad `[snapshot]` or `[pool.restore]`).
 */
export async function createVmRuntime(cfg: Config, db: Db, oc: OrchestratorConfig): Promise<VmRuntime> {
  const runtimePath = cfg.runtime_path;
  // bad [snapshot.s3] or [pool.restore] settings stop the start before anything is started
  snapshotConfig(cfg);
  restorePoolOptions(cfg);
  const driver = await createDriver(cfg);
  // before the disk daemon or any VMM is spawned: "all" is inherited by what the node starts
  const ksm = applyKsm({ mode: cfg.vm.ksm, scanSecs: cfg.vm.ksm_scan_secs, maxCpuPercent: cfg.vm.ksm_max_cpu_percent, pagesToScan: cfg.vm.ksm_pages_to_scan, driver: driver.name });
  if (ksm.mode !== "off") {
    const h = (s: typeof ksm.before) => s && { run: s.run, pagesToScan: s.pagesToScan, sleepMs: s.sleepMs, useZeroPages: s.useZeroPages, advisor: s.advisorMode, advisorMaxCpu: s.advisorMaxCpu, advisorScanSecs: s.advisorTargetScanSecs };
    logger("vmm.ksm").info({ mode: ksm.mode, processMerge: ksm.processMerge, before: h(ksm.before), after: h(ksm.after) }, "kernel samepage merging on");
  }
  if (ksm.warning) logger("vmm.ksm").warn({ mode: ksm.mode, driver: driver.name }, ksm.warning);
  const homePath = cfg.home_path;
  // adopt: a daemon a previous node left serving is kept with its devices (claimed by recover)
  const disks = new DiskService({ dir: join(runtimePath, "disk"), config: diskConfig(cfg), mode: "adopt" });
  // the egress interceptor resolves rules' secrets per request: this node's store or the gateway's
  const secrets = openSecrets(cfg, db);
  const net = new NetworkManager(netConfigFromConfig(cfg), db, { resolveSecret: (name) => secrets.source.resolve(name), label: cfg.node.id || hostname() });
  let kernel: string | undefined;
  return new VmRuntime({
    ...vmRuntimeOptions(cfg, oc, { driver, net, disks, kernelPath: () => (kernel ??= resolveKernelPath(cfg)), toolsImage: () => resolveTools(homePath).path }),
    adoptAtStart: true,
    onClose: () => net.shutdown(),
  });
}

/**
 * The options of a VM runtime over `cfg` and `oc` (paths, timeouts, defaults, snapshot services,
 * volumes) made of `parts`, which the caller built and starts.
 */
export function vmRuntimeOptions(
  cfg: Config,
  oc: Pick<OrchestratorConfig, "defaultCpuCount" | "defaultMemoryMB" | "envdPollMs">,
  parts: Pick<VmRuntimeOptions, "driver" | "net" | "disks" | "kernelPath" | "toolsImage">,
): VmRuntimeOptions {
  const homePath = cfg.home_path;
  return {
    ...parts,
    homePath,
    runtimePath: cfg.runtime_path,
    defaultCpuCount: oc.defaultCpuCount,
    defaultMemoryMB: oc.defaultMemoryMB,
    envdPollMs: oc.envdPollMs,
    readyTimeoutMs: cfg.template_build.ready_timeout_ms,
    readyPollMs: cfg.template_build.create_ready_poll_ms,
    readyProbeTimeoutMs: cfg.template_build.ready_probe_timeout_ms,
    restorePool: restorePoolOptions(cfg),
    bootSnapshots: cfg.vm.boot_snapshots,
    defaultUser: "user",
    snapshots: snapshotServices(cfg, parts.disks),
    volumes: {
      volumesDir: join(homePath, "volumes"),
      hostDir: join(cfg.runtime_path, "volumes"),
      disks: parts.disks,
      defaults: { uid: cfg.volumes.default_uid, gid: cfg.volumes.default_gid, fileMode: 0o644, dirMode: 0o755 },
      maxListEntries: cfg.volumes.max_list_entries,
      hostIdleMs: cfg.volumes.host_idle_ms,
      guestOpTimeoutMs: cfg.volumes.guest_op_timeout_ms,
    },
  };
}
