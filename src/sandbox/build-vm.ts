/**
 * Build VMs for template builds (the `BuildVmLauncher` port of src/template): an internal
 * sandbox — network slot, the disk daemon's export of the build's layers plus a fresh upper,
 * the VMM, envd initialised as root — that is not in the orchestrator's table. Its work dir is
 * `$home/sandboxes/build-<id>/`, so start-up reaping removes what a crashed node left.
 *
 * A checkpoint freezes and thaws the guest's root filesystem (fsfreeze, FIFREEZE: every dirty
 * block and the journal reach the disk; `sync` alone where the image has no fsfreeze), then reads
 * the export's file at the ranges the writable upper holds and stores the blocks that differ
 * from the parent layers as one committed layer. The last build VM of a build is committed as the
 * build's snapshot (build-snapshot.ts).
 */
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { ENVD_PORT } from "../envd/version.ts";
import { guestAddress, netSpec, parseEgressPolicy } from "../net/index.ts";
import { logger } from "../observability/log.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { importExtents, openStack, RwLayer, SECTOR } from "../storage/overlaybd/index.ts";
import { upperPaths, type DiskExport } from "../storage/daemon/index.ts";
import type { BuildVm, BuildVmSpec, VmCommand } from "../template/build-vm.ts";
import { KEEP_TMP_ARG, keptBootArgs, probeCommand, toolsBoot } from "../tools/index.ts";
import { layersOf, type LayerHold, type SnapshotManifest } from "../snapshot/index.ts";
import type { VmHandle } from "../vmm/index.ts";
import { restoreBootSnapshot, RootMountError, type BootShape } from "./boot-snapshot.ts";
import { commitBuildSnapshot } from "./build-snapshot.ts";
import { initEnvd, runInGuest, uploadToGuest } from "./envd-client.ts";
import { waitEnvdHealthy } from "./envd-health.ts";
import type { VmRuntimeOptions } from "./options.ts";

const log = logger("template.vm");

/** Bounds of a build VM's work, ms (`[template_build]` vm_boot_timeout_ms, vm_flush_timeout_ms). */
export interface BuildVmTimeouts {
  /** Booting until envd answers. */
  bootMs: number;
  /** Flushing the guest's filesystem before a checkpoint. */
  flushMs: number;
}

/** Merge byte ranges (sorted by start) that touch or overlap. */
function mergeRanges(r: Array<[number, number]>): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (const [a, b] of [...r].sort((x, y) => x[0] - y[0])) {
    const last = out[out.length - 1];
    if (last && a <= last[1]) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

/**
 * Where build VMs find boot snapshots (the VM runtime's): `find` gives the current one of a
 * shape (making it when missing; undefined: boot), `use`/`unuse` count the build VM as one of
 * its users while it runs.
 */
export interface BuildBootSnapshots {
  find(shape: BootShape, signal: AbortSignal): Promise<SnapshotManifest | undefined>;
  use(snapshotId: string, vmId: string): void;
  unuse(snapshotId: string, vmId: string): void;
  /** Restoring it failed (the VM then boots; so do the shape's next ones for a while). */
  failed(snap: SnapshotManifest): void;
}

/**
 * Boot a build VM from `spec.layers` (or restore the boot snapshot of its shape, with
 * `bootSnapshots`) and wait until its envd is initialised.
 * @throws OrchestratorError / DiskError / VmmError / NetError from the parts; everything made is
 *   freed first.
 */
export async function bootBuildVm(o: VmRuntimeOptions, spec: BuildVmSpec, t: BuildVmTimeouts, bootSnapshots?: BuildBootSnapshots): Promise<BuildVm> {
  const id = `build-${spec.id.replace(/[^a-z0-9]/g, "").slice(0, 12)}`;
  const workDir = join(o.homePath, "sandboxes", id);
  rmSync(workDir, { recursive: true, force: true });
  mkdirSync(workDir, { recursive: true });
  let disk: DiskExport | undefined;
  let vm: VmHandle | undefined;
  let slotTaken = false;
  /** The boot snapshot the VM was restored from, and the one held (users count, layers) meanwhile. */
  let fromBoot: SnapshotManifest | undefined;
  let held: SnapshotManifest | undefined;
  let bootHold: LayerHold | undefined;
  const releaseBoot = () => {
    if (held) bootSnapshots?.unuse(held.id, id);
    bootHold?.release();
    held = undefined;
    bootHold = undefined;
  };
  // streams of commands left running (the start command): ended before a snapshot is taken
  const streams = new AbortController();
  const stopVm = async () => {
    streams.abort();
    if (vm) await vm.stop().catch((e) => log.error({ id, err: e }, "build VM stop failed"));
    vm = undefined;
    await disk?.close().catch((e) => log.error({ id, err: e }, "build disk close failed"));
    disk = undefined;
  };
  const stop = async () => {
    await stopVm();
    // only now: a snapshot committed from this VM names the boot snapshot's layers once published
    releaseBoot();
    if (slotTaken) await o.net.release(id).catch((e) => log.error({ id, err: e }, "build slot release failed"));
    slotTaken = false;
    rmSync(workDir, { recursive: true, force: true });
  };
  try {
    disk = await o.disks.rootDisk({ id, lowers: spec.layers, sandboxDir: workDir, virtualSize: spec.diskBytes });
    const slot = await o.net.allocate(parseEgressPolicy({}), id);
    slotTaken = true;
    const kernelPath = o.kernelPath();
    const base = `http://${guestAddress(slot, ENVD_PORT).host}:${ENVD_PORT}`;
    const bootSignal = AbortSignal.any([spec.signal, AbortSignal.timeout(t.bootMs)]);
    // a restored kernel would not see kernel arguments of the build's own: those boot
    const snap = keptBootArgs(spec.bootArgs).length === 0 ? await bootSnapshots?.find({ vcpus: spec.cpuCount, memoryMiB: spec.memoryMB }, bootSignal) : undefined;
    // a restored VM keeps the tools drive and MAC of its boot snapshot
    const diskPath = disk.path;
    const toolsOf = (from: SnapshotManifest | undefined) => (from ? o.snapshots.repo.layerPath(from.tools!) : o.toolsImage());
    const vmSpec = (from: SnapshotManifest | undefined) => {
      const boot = toolsBoot(toolsOf(from), diskPath, spec.bootArgs);
      const net = from ? { ...netSpec(slot), mac: from.vm.mac } : netSpec(slot);
      return { id, workDir, kernelPath, bootArgs: `${boot.bootArgs} aenv.hostname=build ${KEEP_TMP_ARG}`, vcpus: spec.cpuCount, memoryMiB: spec.memoryMB, drives: boot.drives, net };
    };
    if (snap) {
      // held from here until the build VM is gone (stop): its users count and its layers
      bootSnapshots!.use(snap.id, id);
      held = snap;
      bootHold = await o.snapshots.remote?.acquire(layersOf(snap));
      const deps = { repo: o.snapshots.repo, images: o.snapshots.images, driver: o.driver, envdPollMs: o.envdPollMs, log };
      try {
        vm = await restoreBootSnapshot(deps, snap, vmSpec(snap), base, bootSignal);
        fromBoot = snap;
      } catch (e) {
        if (spec.signal.aborted) throw e;
        if (!(e instanceof RootMountError)) bootSnapshots!.failed(snap);
        log.warn({ id, bootSnapshot: snap.id, err: e }, "restoring the boot snapshot failed: booting the build VM");
        releaseBoot();
      }
    }
    const used = vmSpec(fromBoot);
    if (!vm) {
      vm = await o.driver.boot(used);
      await waitEnvdHealthy(base, o.envdPollMs, bootSignal, vm.exited);
    }
    const toolsImage = toolsOf(fromBoot);
    const net = used.net;
    await initEnvd(base, { envVars: {}, defaultUser: "root", defaultWorkdir: "/", timestamp: new Date().toISOString(), hostname: "build" }, null, bootSignal);
    log.info({ id, layers: spec.layers.length, ...(fromBoot ? { bootSnapshot: fromBoot.id } : {}) }, "build VM ready");
    const run = async (c: VmCommand) => {
      const timeout = AbortSignal.timeout(c.timeoutMs);
      try {
        const proc = c.probe ? probeCommand(c.script) : { cmd: "/bin/sh", args: ["-c", c.script] };
        return await runInGuest(base, { ...proc, user: c.user, cwd: c.cwd, envs: c.envs }, AbortSignal.any([spec.signal, timeout]), c.onOutput);
      } catch (e) {
        if (timeout.aborted && !spec.signal.aborted) return { exitCode: -1, output: `timed out after ${c.timeoutMs} ms` };
        throw e;
      }
    };
    return {
      run,
      async spawn(c) {
        const done = runInGuest(base, { cmd: "/bin/sh", args: ["-c", c.script], user: c.user, cwd: c.cwd, envs: c.envs }, AbortSignal.any([spec.signal, streams.signal]), c.onOutput);
        done.catch(() => {}); // the VM stops under it at the end of the build
        return { pid: 0, done };
      },
      upload: (local, guestPath) => uploadToGuest(base, local, guestPath, "root", spec.signal),
      async checkpoint(outPath, parentLayers) {
        const flush = await run({ script: "sync; if command -v fsfreeze >/dev/null 2>&1; then fsfreeze -f / && fsfreeze -u /; fi; sync", user: "root", cwd: "/", timeoutMs: t.flushMs });
        if (flush.exitCode !== 0) throw new OrchestratorError("orchestrator.runtime_failed", `flushing the build VM's disk failed: ${flush.output}`, { id });
        const upper = upperPaths(workDir);
        const rw = await RwLayer.open(upper.data, upper.index, { readOnly: true });
        const ranges = mergeRanges(rw.segments.map((s) => [s.offset * SECTOR, (s.offset + s.length) * SECTOR] as [number, number]));
        await rw.close();
        const parent = await openStack({ lowers: parentLayers });
        try {
          const r = await importExtents(diskPath, ranges, outPath, { parent, meta: { virtualSize: spec.diskBytes } });
          return r.size;
        } finally {
          await parent.close();
        }
      },
      async commitSnapshot(source) {
        const running = vm;
        if (!running) throw new OrchestratorError("orchestrator.runtime_failed", `build VM ${id} is not running`, { id });
        // the start command keeps running in the guest; its output stream to this build ends here
        streams.abort();
        try {
          const r = await commitBuildSnapshot(o.snapshots.repo, running, { spec, driver: o.driver.name, kernelPath, toolsImage, mac: net.mac, workDir, fromBoot }, source, stopVm);
          log.info({ id, snapshot: r.snapshotId, memoryBytes: r.memoryBytes }, "build snapshot committed");
          return r;
        } finally {
          await stop();
        }
      },
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}
