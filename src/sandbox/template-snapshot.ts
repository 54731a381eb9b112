/**
 * Templates are snapshots: boot a template's image once in a VM shaped like a sandbox (same
 * devices, network as a slot gives it: guest 169.254.0.21, gateway 169.254.0.22 with the slot
 * tap's MAC), wait until envd answers and has served what a create's first requests ask of a
 * restored guest (warm: `warmTemplateEnvd`), then commit the paused
 * VM (device state, RAM image imported sparse, the boot's disk writes as a layer over the
 * template's layers) as the template's snapshot and record its id in the template manifest.
 * Sandboxes of the template are then restores of this snapshot.
 *
 * Runs without a node (the `template build-base` command): its VMM records, disk export and
 * network namespace are private to the build (`templates/.snapshot/<name>-<pid>/`, netns
 * `aenvtpl<pid>`), and what a crashed build left is reaped by the next one.
 */
import { existsSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Config } from "../config/index.ts";
import { ENVD_PORT } from "../envd/version.ts";
import { GUEST_IP, makeTapNamespace, reapTapNamespaces } from "../net/index.ts";
import { logger } from "../observability/log.ts";
import { openRepository, snapshotConfig } from "../snapshot/index.ts";
import { agentenvCommand, diskConfig, DiskService, reapStaleMounts, upperPaths, type DiskExport } from "../storage/daemon/index.ts";
import { readManifest, resolveTemplate, TemplateError, writeManifest } from "../template/index.ts";
import { KEEP_TMP_ARG, resolveTools, toolsBoot } from "../tools/index.ts";
import { errorMessage } from "../util/error.ts";
import { createDriver, resolveKernelPath, type VmHandle } from "../vmm/index.ts";
import { captureVm, commitUpper, kernelKey, templateManifest } from "./capture.ts";
import { initEnvd, runInGuest, type GuestResult } from "./envd-client.ts";

const log = logger("template.snapshot");

/** Guest MAC of template VMs (kept by every sandbox restored from them; each sits in its own netns). */
export const TEMPLATE_GUEST_MAC = "02:ae:fe:00:00:01";
/** Prefix of the build's network namespace (`<prefix><pid>`). */
const NETNS_PREFIX = "aenvtpl";

/** Result of `commitTemplateSnapshot`. */
export interface TemplateSnapshotResult {
  snapshotId: string;
  /** False when the template's snapshot was already current (nothing booted). */
  built: boolean;
  /** Guest RAM bytes the memory layer holds data for, and ms to envd ready. */
  memoryBytes: number;
  readyMs: number;
}

/**
 * Make (or find current) the snapshot of template `name` in the node's repository.
 * @param onProgress phase + detail lines for a terminal
 * @throws TemplateError `template.snapshot_failed` naming the step; VmmError, NetError, SnapshotError
 */
export async function commitTemplateSnapshot(cfg: Config, name: string, onProgress: (phase: string, detail: string) => void = () => {}): Promise<TemplateSnapshotResult> {
  const home = cfg.home_path;
  const sc = snapshotConfig(cfg);
  // with [snapshot.s3] the commit is pushed before this returns; the node's cache is left alone
  const { repo, remote } = openRepository(sc, { evict: false });
  const tpl = resolveTemplate(home, name);
  if (tpl.rootLayers.length === 0) throw new TemplateError("template.snapshot_failed", `template ${name} has no overlaybd layers to boot from`, { name });
  // through the node's tools drive, as every sandbox boots; the snapshot keeps a copy of it
  const tools = resolveTools(home);
  const kernelPath = resolveKernelPath(cfg);
  const kernel = kernelKey(kernelPath);
  const workRoot = join(home, "templates", ".snapshot");
  const work = join(workRoot, `${name}-${process.pid}`);
  // a private runtime dir: a node's start-up reaping never touches this VM
  const driver = await createDriver({ ...cfg, runtime_path: work });
  if (tpl.snapshot) {
    const have = repo.find(tpl.snapshot);
    const current = have && have.templateBuild === tpl.buildKey && have.toolsKey === tools.key && have.vm.kernelKey === kernel && have.vm.machine === driver.machineKey;
    if (have && current && have.memory && !repo.isTombstoned(have.id)) {
      onProgress("snapshot", `cached ${have.id}`);
      return { snapshotId: have.id, built: false, memoryBytes: 0, readyMs: 0 };
    }
  }
  const vcpus = cfg.template.cpu_count;
  const memoryMiB = cfg.template.memory_mib;
  const timeoutMs = cfg.template.snapshot_ready_timeout_ms;
  await reapStaleWork(workRoot, cfg);
  await reapTapNamespaces(NETNS_PREFIX, 10_000);
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work, { recursive: true });
  const id = `tpl${process.pid}`;
  let step = "network";
  let vm: VmHandle | undefined;
  const ns = await makeTapNamespace(`${NETNS_PREFIX}${process.pid}`, 10_000);
  const txn = repo.begin();
  // a disk daemon of its own, on the build folder: a node's daemon and this build never meet
  const disks = new DiskService({ dir: join(work, "daemon"), config: diskConfig(cfg) });
  let disk: DiskExport | undefined;
  try {
    step = "disk";
    const diskDir = join(work, "disk");
    disk = await disks.rootDisk({ id, lowers: tpl.rootLayers, sandboxDir: diskDir, virtualSize: tpl.diskBytes });
    step = "boot";
    onProgress("snapshot", `booting ${name} (${vcpus} vCPU, ${memoryMiB} MiB)`);
    const t0 = performance.now();
    const boot = toolsBoot(tools.path, disk.path, tpl.bootArgs);
    vm = await driver.boot({
      id,
      workDir: join(work, "vm"),
      kernelPath,
      // still the template build: what its steps left in /tmp stays in the template
      bootArgs: `${boot.bootArgs} ${KEEP_TMP_ARG}`,
      vcpus,
      memoryMiB,
      drives: boot.drives,
      net: ns.spec(TEMPLATE_GUEST_MAC),
    });
    step = "envd";
    await probeEnvd(ns.netnsPath, `http://${GUEST_IP}:${ENVD_PORT}`, timeoutMs, vm.exited);
    const readyMs = Math.round(performance.now() - t0);
    onProgress("snapshot", `envd ready after ${readyMs} ms; capturing`);
    step = "capture";
    await vm.pause();
    const cap = await captureVm(vm, txn, memoryMiB * 1024 * 1024, []);
    step = "stop";
    await vm.stop();
    vm = undefined;
    await disk.close();
    disk = undefined;
    step = "commit";
    const base = tpl.rootLayers.map((p) => txn.addLayer(p, { keepSource: true }));
    const up = await commitUpper(txn, tpl.rootLayers, upperPaths(diskDir));
    const diskLayers = [...base, ...(up ? [up.layer] : [])];
    const m = { ...templateManifest(tpl, { driver: driver.name, machine: driver.machineKey, vcpus, memoryMiB, kernelKey: kernel, mac: TEMPLATE_GUEST_MAC }, diskLayers, cap), tools: txn.addLayer(tools.path, { keepSource: true }), toolsKey: tools.key };
    txn.publish(m);
    // the template now names it; older snapshots of the template go once no sandbox runs from them
    writeManifest(home, { ...readManifest(home, name), snapshot: m.id, cpuCount: vcpus, memoryMB: memoryMiB });
    for (const o of repo.list()) if (o.kind === "template" && o.source.templateId === name && o.id !== m.id) repo.tombstone(o.id);
    log.info({ name, snapshot: m.id, memoryBytes: cap.changedBytes, readyMs }, "template snapshot committed");
    onProgress("snapshot", `committed ${m.id} (memory ${(cap.changedBytes / 1048576).toFixed(1)} MiB)`);
    if (remote) {
      onProgress("snapshot", `pushing ${m.id} to ${remote.store.location}`);
      await remote.flush();
      // a failed push is logged; the node's sync pushes it later
      onProgress("snapshot", remote.isStored(m.id) ? `pushed ${m.id}` : `push of ${m.id} failed: the node pushes it at its next sync`);
    }
    return { snapshotId: m.id, built: true, memoryBytes: cap.changedBytes, readyMs };
  } catch (e) {
    txn.abort();
    const console = vm && "consoleTail" in vm ? (vm as unknown as { consoleTail(n: number): string }).consoleTail(2000) : "";
    throw new TemplateError("template.snapshot_failed", `snapshot of template ${name} failed at ${step}: ${errorMessage(e)}`, { name, step, console }, { cause: e });
  } finally {
    await vm?.stop().catch(() => {});
    await disk?.close().catch(() => {});
    await disks.close().catch(() => {});
    await ns.destroy();
    rmSync(work, { recursive: true, force: true });
  }
}

/** Remove build folders of builds whose process is gone (their disk daemon and mounts first). */
async function reapStaleWork(workRoot: string, cfg: Config): Promise<void> {
  if (!existsSync(workRoot)) return;
  for (const d of readdirSync(workRoot)) {
    const pid = Number(d.split("-").at(-1));
    if (Number.isInteger(pid) && pid > 0 && pid !== process.pid) {
      try {
        process.kill(pid, 0);
        continue;
      } catch {
        // gone: reap below
      }
    }
    const dir = join(workRoot, d);
    // starting a service on the dead build's daemon folder shuts its leftover daemon down
    const leftover = new DiskService({ dir: join(dir, "daemon"), config: diskConfig(cfg) });
    await leftover.start().catch(() => {});
    await leftover.close().catch(() => {});
    reapStaleMounts([dir]);
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Wait (inside netns `netnsPath`) until envd at `url` answers and has run a first command as
 * the default user, by running `agentenv template probe-envd` there.
 * @throws TemplateError `template.snapshot_failed` with the probe's output
 */
async function probeEnvd(netnsPath: string, url: string, timeoutMs: number, vmExited: Promise<unknown>): Promise<void> {
  const p = Bun.spawn(["nsenter", `--net=${netnsPath}`, "--", ...agentenvCommand(), "template", "probe-envd", "--url", url, "--timeout-ms", String(timeoutMs)], {
    stdout: "pipe",
    stderr: "pipe",
  });
  const died = vmExited.then(() => p.kill("SIGKILL"));
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  void died;
  if (code !== 0) throw new TemplateError("template.snapshot_failed", `envd probe exited ${code}: ${(out + err).trim().slice(-1500)}`, { code });
}

/** Rounds of the warm-up in `warmTemplateEnvd`. */
export const WARM_ROUNDS = 3;

/**
 * Warm a template VM's envd before its snapshot is committed: every create restored from it
 * first gets POST /init (as the node sends it, here without a token) and then, from the SDK,
 * `commands.run` (`/bin/bash -l -c <cmd>` as the default user). Run here `WARM_ROUNDS` times
 * each, the code envd runs for them is compiled and the files bash reads (binary, libraries,
 * profile scripts) are in the guest's page cache in the snapshot, so restored guests do not pay
 * that on their first request. Leaves envd without a token (the template's manifest says none).
 * @returns the last command's result (`id -un`: "user" when the guest is as expected)
 * @throws OrchestratorError from envd (`envd_init_failed`, `envd_failed`)
 */
export async function warmTemplateEnvd(url: string, signal: AbortSignal): Promise<GuestResult> {
  let r: GuestResult | undefined;
  for (let i = 0; i < WARM_ROUNDS; i++) {
    await initEnvd(url, { accessToken: "", envVars: {}, defaultUser: "user", defaultWorkdir: "/home/user", timestamp: new Date().toISOString(), hostname: "template" }, null, signal);
    r = await runInGuest(url, { cmd: "/bin/bash", args: ["-l", "-c", "id -un"], user: "user" }, signal);
  }
  return r!;
}
