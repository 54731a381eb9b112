/**
 * Boot snapshots: a cold boot without booting. A VM of one shape (vCPUs, memory) is booted
 * once through the tools drive with `aenv.boot=wait`: the guest init starts envd on the tools
 * drive itself and leaves the root disk (a sparse placeholder, BOOT_PLACEHOLDER_BYTES) alone.
 * That VM is paused and committed to the snapshot repository as a snapshot of kind `boot`
 * (device state, memory layer, the placeholder as its disk layer, a copy of the tools drive).
 * A cold boot of any template of that shape then restores it with the template's disk in the
 * placeholder's place and has envd run `/.aenv/init mount-root` (src/tools/init.sh), which drops
 * the kernel's cached blocks of the placeholder, mounts the disk and pivots into it, envd and
 * PID 1 with it. The kernel boot and Bun's start (most of a cold boot under TCG) are then paid
 * once per shape, not per boot; the guest sees the same devices, addresses and MAC as the booted
 * VM had.
 *
 * The guest kernel read the placeholder's capacity when it probed it, in the boot snapshot: a
 * restore first tells it the sandbox disk's size (a virtio config change, `driveResized`), and
 * mount-root waits until the kernel sees that size. So one boot snapshot serves every disk size.
 * A create with volumes restores a boot snapshot of its shape made with as many placeholder
 * volume drives (`BootShape.volumeSlots`): the sandbox's volume drives take their places, and
 * the restore re-probes them once the root disk is mounted (`reprobeVolumesInGuest`), so the guest
 * reads each volume's size and read-only flag afresh and nothing of the placeholder it probed.
 * A boot snapshot is current while the node's kernel, tools drive and VMM driver are those it
 * was made with; an older one is tombstoned when a new one is made (removed once no sandbox
 * runs from it). When and when not to use one (a template's own kernel arguments, Firecracker,
 * a failed restore) is the VM runtime's choice (vm-runtime.ts `bootSnapshotFor`).
 */
import { mkdirSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { ENVD_PORT, ENVD_VERSION } from "../envd/version.ts";
import { guestAddress, netSpec, parseEgressPolicy, type NetworkManager } from "../net/index.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { newSnapshotId, type LocalRepository, type SharedImages, type SnapshotManifest } from "../snapshot/index.ts";
import { importSparse } from "../storage/overlaybd/index.ts";
import { KEEP_TMP_ARG, ROOTFS_DEVICE, ROOTFS_DRIVE_ID, TOOLS_MOUNT, toolsBoot } from "../tools/index.ts";
import { errorMessage } from "../util/error.ts";
import type { DriveSpec, VmHandle, VmmDriver, VmSpec } from "../vmm/index.ts";
import { toolsKeyOf } from "./build-snapshot.ts";
import { captureVm, layerPaths, memoryKey } from "./capture.ts";
import { runInGuest } from "./envd-client.ts";
import { waitEnvdHealthy } from "./envd-health.ts";
import { REPROBE_SCRIPT } from "./volumes.ts";

const MiB = 1024 * 1024;
/** Kernel argument of a boot snapshot's boot (src/tools/init.sh). */
export const BOOT_WAIT_ARG = "aenv.boot=wait";

/** The VM shape a boot snapshot is made for. */
export interface BootShape {
  vcpus: number;
  memoryMiB: number;
  /** Placeholder volume drives after the root disk (`vol0`...), 0 when absent. */
  volumeSlots?: number;
}

/** The key of a shape in maps and VM ids: `<vcpus>c<memoryMiB>m`, then `<n>v` with volume slots. */
export function bootShapeKey(shape: BootShape): string {
  return `${shape.vcpus}c${shape.memoryMiB}m${shape.volumeSlots ? `${shape.volumeSlots}v` : ""}`;
}

/** The shape a boot snapshot was made for. */
export function bootShapeOf(m: SnapshotManifest): BootShape {
  return { vcpus: m.vm.vcpus, memoryMiB: m.vm.memoryMiB, volumeSlots: m.vm.volumeSlots ?? 0 };
}

/**
 * Size of each placeholder volume drive of a boot snapshot, bytes (sparse, never written; the
 * guest re-probes the drive that takes its place, so any size works).
 */
export const VOLUME_PLACEHOLDER_BYTES = 64 * 1024 * 1024;

/** Virtio serial of placeholder volume drive `i` of a boot snapshot's VM. */
export function volumePlaceholderSerial(i: number): string {
  return `aenvplaceholder${i}`;
}

/**
 * Size of a boot snapshot's placeholder root disk, bytes. Any size works: a restored VM's
 * guest is told its own disk's size before it mounts it (`VmHandle.driveResized`).
 */
export const BOOT_PLACEHOLDER_BYTES = 1024 * 1024 * 1024;

/** What makes a boot snapshot current: the node's driver and its machine, guest kernel and tools drive. */
export interface BootKeys {
  driver: SnapshotManifest["vm"]["driver"];
  /** `VmmDriver.machineKey`. */
  machineKey: string;
  kernelKey: string;
  /** Tools drive image path (`$home/tools/<key>/tools.ext4`). */
  toolsImage: string;
}

/** What making a boot snapshot needs. */
export interface BootSnapshotDeps {
  repo: LocalRepository;
  driver: VmmDriver;
  net: NetworkManager;
  kernelPath: string;
  /** Directory for the boot VM's work dir (removed afterwards). */
  workRoot: string;
  /** envd /health poll period and the bound on the whole boot, ms. */
  envdPollMs: number;
  bootTimeoutMs: number;
  log: Logger;
}

/** The current boot snapshot of `shape` in `repo`, if any (the newest). */
export function findBootSnapshot(repo: LocalRepository, shape: BootShape, keys: BootKeys): SnapshotManifest | undefined {
  const toolsKey = toolsKeyOf(keys.toolsImage);
  return repo
    .list()
    .filter(
      (m) =>
        m.kind === "boot" &&
        m.memory !== null &&
        m.vmState !== null &&
        m.tools !== undefined &&
        m.vm.vcpus === shape.vcpus &&
        m.vm.memoryMiB === shape.memoryMiB &&
        (m.vm.volumeSlots ?? 0) === (shape.volumeSlots ?? 0) &&
        m.vm.driver === keys.driver &&
        m.vm.machine === keys.machineKey &&
        m.vm.kernelKey === keys.kernelKey &&
        m.toolsKey === toolsKey,
    )
    .at(-1);
}

/** Boot snapshots no longer current (another kernel, tools drive, driver or machine). */
export function staleBootSnapshots(repo: LocalRepository, keys: BootKeys): SnapshotManifest[] {
  const toolsKey = toolsKeyOf(keys.toolsImage);
  return repo.list().filter((m) => m.kind === "boot" && (m.vm.driver !== keys.driver || m.vm.machine !== keys.machineKey || m.vm.kernelKey !== keys.kernelKey || m.toolsKey !== toolsKey));
}

/**
 * Boot a VM of `shape` up to envd without a root filesystem (and with `shape.volumeSlots`
 * placeholder volume drives, `vol0`...) and commit it as a `boot` snapshot.
 * Takes a network slot for the boot (released before this returns).
 * @param id VM and slot id of the boot (letters, digits and '-', e.g. `bootsnap-1c512m`)
 * @returns the published manifest
 * @throws OrchestratorError `orchestrator.envd_unready` when envd does not come up,
 *   `orchestrator.runtime_failed` when its warm-up command fails; VmmError, NetError,
 *   SnapshotError from the parts (nothing published)
 */
export async function makeBootSnapshot(d: BootSnapshotDeps, id: string, shape: BootShape, keys: BootKeys, signal: AbortSignal): Promise<SnapshotManifest> {
  const t0 = performance.now();
  const workDir = join(d.workRoot, id);
  rmSync(workDir, { recursive: true, force: true });
  mkdirSync(workDir, { recursive: true });
  const placeholder = join(workDir, "placeholder.raw");
  writeFileSync(placeholder, "");
  truncateSync(placeholder, BOOT_PLACEHOLDER_BYTES);
  const slots = shape.volumeSlots ?? 0;
  const volumeDrives: DriveSpec[] = [];
  for (let i = 0; i < slots; i++) {
    const path = join(workDir, `volume-placeholder-${i}.raw`);
    writeFileSync(path, "");
    truncateSync(path, VOLUME_PLACEHOLDER_BYTES);
    // ids and order as serveVolumeDrives gives a sandbox's volumes
    volumeDrives.push({ id: `vol${i}`, path, readOnly: false, isRoot: false, serial: volumePlaceholderSerial(i) });
  }
  let vm: VmHandle | undefined;
  let slotTaken = false;
  const txn = d.repo.begin();
  try {
    const slot = await d.net.allocate(parseEgressPolicy({}), id);
    slotTaken = true;
    const net = netSpec(slot);
    const boot = toolsBoot(keys.toolsImage, placeholder, BOOT_WAIT_ARG);
    vm = await d.driver.boot({ id, workDir, kernelPath: d.kernelPath, bootArgs: boot.bootArgs, vcpus: shape.vcpus, memoryMiB: shape.memoryMiB, drives: [...boot.drives, ...volumeDrives], net });
    const base = `http://${guestAddress(slot, ENVD_PORT).host}:${ENVD_PORT}`;
    const bootSignal = AbortSignal.any([signal, AbortSignal.timeout(d.bootTimeoutMs)]);
    await waitEnvdHealthy(base, d.envdPollMs, bootSignal, vm.exited);
    // one command through envd before the capture: the code of a process start is then compiled
    // in the snapshot's memory, not in every restored VM's first command (mount-root)
    const warm = await runInGuest(base, { cmd: `${TOOLS_MOUNT}/bin/true`, args: [], user: "root", cwd: "/", envs: {} }, bootSignal);
    if (warm.exitCode !== 0) throw new OrchestratorError("orchestrator.runtime_failed", `boot snapshot ${id}: warm-up command exited ${warm.exitCode}: ${warm.output.slice(-300)}`, { id });
    const readyMs = Math.round(performance.now() - t0);
    await vm.pause();
    const cap = await captureVm(vm, txn, shape.memoryMiB * MiB, []);
    await vm.stop();
    vm = undefined;
    const diskOut = txn.file("disk.layer");
    await importSparse(placeholder, diskOut);
    const m: SnapshotManifest = {
      version: 1,
      id: newSnapshotId(),
      kind: "boot",
      parent: null,
      createdAt: new Date().toISOString(),
      names: [],
      source: { sandboxId: null, templateId: "" },
      vm: { driver: keys.driver, machine: keys.machineKey, vcpus: shape.vcpus, memoryMiB: shape.memoryMiB, kernelKey: keys.kernelKey, mac: net.mac, bootArgs: boot.bootArgs, ...(slots > 0 ? { volumeSlots: slots } : {}) },
      envd: { version: ENVD_VERSION, accessToken: null },
      disk: { virtualSize: BOOT_PLACEHOLDER_BYTES, layers: [txn.addLayer(diskOut)] },
      memory: { size: shape.memoryMiB * MiB, layers: [cap.memory] },
      vmState: cap.vmState,
      tools: txn.addLayer(keys.toolsImage, { keepSource: true }),
      toolsKey: toolsKeyOf(keys.toolsImage),
    };
    txn.publish(m);
    d.log.info({ snapshot: m.id, ...shape, readyMs, memoryBytes: cap.changedBytes, totalMs: Math.round(performance.now() - t0) }, "boot snapshot committed");
    return m;
  } catch (e) {
    txn.abort();
    throw e;
  } finally {
    if (vm) await vm.stop().catch((e) => d.log.error({ id, err: e }, "boot snapshot VM stop failed"));
    if (slotTaken) await d.net.release(id).catch((e) => d.log.error({ id, err: e }, "boot snapshot slot release failed"));
    rmSync(workDir, { recursive: true, force: true });
  }
}

/** What restoring a boot snapshot needs. */
export interface BootRestoreDeps {
  repo: LocalRepository;
  images: SharedImages;
  driver: VmmDriver;
  envdPollMs: number;
  log: Logger;
}

/**
 * The guest could not mount the sandbox's root disk (`init mount-root` failed): a fault of that
 * disk as likely as of the boot snapshot, so a caller falling back to a boot does not blame the
 * snapshot for it.
 */
export class RootMountError extends OrchestratorError {}

/**
 * Start the VM of `spec` (its drives: `toolsBoot` of `snap`'s tools drive and the sandbox's root
 * disk, then as many volume drives `vol0`... as `snap` has volume slots; its net: a slot's, whose
 * envd answers at `envd`) from boot snapshot `snap`, mount the root disk in it and re-probe the
 * volume drives (not mount them: `mountVolumesInGuest`). The memory image is held until the VMM
 * exits. The caller holds `snap` (its users count, its layers) for as long as the VM may run.
 * @returns the running VM, envd answering on the sandbox's root filesystem (not yet /init-ed)
 * @throws VmmError / SnapshotError from the restore; OrchestratorError `orchestrator.envd_unready`
 *   or `orchestrator.envd_failed` from envd, `orchestrator.runtime_failed` for a root disk of
 *   another size than whole sectors, another number of volume drives than `snap` has slots, a
 *   volume drive without a serial or a failed re-probe; RootMountError from the mount (the VM is
 *   stopped first whenever it was started)
 */
export async function restoreBootSnapshot(d: BootRestoreDeps, snap: SnapshotManifest, spec: VmSpec, envd: string, signal: AbortSignal): Promise<VmHandle> {
  // the restored guest has as many volume drives as the snapshot's VM had placeholders
  const volumeDrives = spec.drives.filter((x) => /^vol\d+$/.test(x.id));
  const volumes = volumeDrives.length;
  if (volumes !== (snap.vm.volumeSlots ?? 0)) {
    throw new OrchestratorError("orchestrator.runtime_failed", `VM ${spec.id} has ${volumes} volume drives, boot snapshot ${snap.id} has ${snap.vm.volumeSlots ?? 0} places for them`, { id: spec.id, snapshot: snap.id });
  }
  const t0 = performance.now();
  const lease = await d.images.acquire(memoryKey(snap), layerPaths(d.repo, snap.memory!.layers));
  let vm: VmHandle;
  try {
    vm = await d.driver.restore({ ...spec, vcpus: snap.vm.vcpus, memoryMiB: snap.vm.memoryMiB }, { statePath: d.repo.layerPath(snap.vmState!), memPath: lease.path, kind: "full" }, { resume: true });
  } catch (e) {
    await lease.release().catch((err) => d.log.error({ id: spec.id, err }, "memory image release after a failed restore failed"));
    throw e;
  }
  // the image may go only once the VMM that maps it is gone
  void vm.exited.then(() => lease.release()).catch((e) => d.log.error({ id: spec.id, err: e }, "memory image release failed"));
  try {
    // the guest kernel knows the placeholder's size: give it the sandbox disk's
    const root = spec.drives.find((x) => x.id === ROOTFS_DRIVE_ID);
    if (!root) throw new OrchestratorError("orchestrator.runtime_failed", `VM ${spec.id} has no ${ROOTFS_DRIVE_ID} drive to mount`, { id: spec.id });
    const bytes = servedSize(root.path);
    if (bytes % 512 !== 0) throw new OrchestratorError("orchestrator.runtime_failed", `root disk ${root.path} is ${bytes} bytes, not whole 512-byte sectors`, { id: spec.id, bytes });
    const t1 = performance.now();
    if (bytes !== snap.disk.virtualSize) await vm.driveResized(root, bytes);
    await waitEnvdHealthy(envd, d.envdPollMs, signal, vm.exited);
    const t2 = performance.now();
    // a build VM's spec says keep /tmp (KEEP_TMP_ARG); a restored kernel never reads it, mount-root does
    await mountRootInGuest(envd, bytes / 512, signal, "ext4", { keepTmp: spec.bootArgs.split(" ").includes(KEEP_TMP_ARG) });
    const t3 = performance.now();
    if (volumes > 0) await reprobeVolumesInGuest(envd, volumeDrives.map((x) => x.serial), signal);
    const ms = (a: number, b: number) => Math.round(b - a);
    d.log.debug({ id: spec.id, snapshot: snap.id, restoreMs: ms(t0, t1), envdMs: ms(t1, t2), mountRootMs: ms(t2, t3), reprobeMs: ms(t3, performance.now()), volumes }, "boot snapshot restored");
  } catch (e) {
    await vm.stop().catch((err) => d.log.error({ id: spec.id, err }, "VM stop after a failed boot snapshot restore failed"));
    throw e;
  }
  return vm;
}

/**
 * In a VM restored from a boot snapshot: have envd mount the sandbox's root disk and pivot into
 * it (`/.aenv/init mount-root`, src/tools/init.sh), once the guest kernel sees the disk at
 * `sectors` (512 bytes each).
 * @param base envd's URL
 * @param o.keepTmp leave /tmp as the disk has it (a template build); else the init empties it as a boot does
 * @throws RootMountError (`orchestrator.runtime_failed`) with the init's words when it fails;
 *   OrchestratorError `orchestrator.envd_failed` when envd refuses the command
 */
export async function mountRootInGuest(base: string, sectors: number, signal: AbortSignal, fstype = "ext4", o: { keepTmp?: boolean } = {}): Promise<void> {
  const envs: Record<string, string> = o.keepTmp ? { AENV_TMP: "keep" } : {};
  const r = await runInGuest(base, { cmd: `${TOOLS_MOUNT}/bin/sh`, args: [`${TOOLS_MOUNT}/init`, "mount-root", ROOTFS_DEVICE, fstype, String(sectors)], user: "root", cwd: "/", envs }, signal);
  if (r.exitCode !== 0) {
    throw new RootMountError("orchestrator.runtime_failed", `mounting the root filesystem in a VM restored from a boot snapshot failed (exit ${r.exitCode}): ${r.output.slice(-500)}`, { base, device: ROOTFS_DEVICE, sectors, exitCode: r.exitCode });
  }
}

/**
 * In a VM restored from a boot snapshot with volume drives in its placeholders' places: have the
 * guest re-probe the drives of `serials` (REPROBE_SCRIPT, with the tools drive's shell, as root).
 * @param base envd's URL
 * @throws OrchestratorError `orchestrator.runtime_failed` with the script's words when a drive
 *   has no serial or its re-probe fails; `orchestrator.envd_failed` when envd refuses the command
 */
export async function reprobeVolumesInGuest(base: string, serials: (string | undefined)[], signal: AbortSignal): Promise<void> {
  if (serials.some((x) => !x)) throw new OrchestratorError("orchestrator.runtime_failed", "a volume drive has no serial: the guest cannot find it to re-probe it", { base });
  const r = await runInGuest(base, { cmd: `${TOOLS_MOUNT}/bin/sh`, args: ["-c", REPROBE_SCRIPT, "sh", ...(serials as string[])], user: "root", cwd: "/", envs: {} }, signal);
  if (r.exitCode !== 0) {
    throw new OrchestratorError("orchestrator.runtime_failed", `re-probing the volume drives of a VM restored from a boot snapshot failed (exit ${r.exitCode}): ${r.output.slice(-500)}`, { base, serials, exitCode: r.exitCode });
  }
}

/**
 * Size in bytes of a served disk as the VMM sees it: a file's size, or a block device's
 * (/sys/dev/block/<major>:<minor>/size, in 512-byte sectors).
 * @throws OrchestratorError `orchestrator.runtime_failed` when the path cannot be read
 */
export function servedSize(path: string): number {
  try {
    const st = statSync(path);
    if (!st.isBlockDevice()) return st.size;
    const major = Math.floor(st.rdev / 256) & 0xfff, minor = (st.rdev & 0xff) | ((st.rdev >>> 12) & 0xfff00);
    return Number(readFileSync(`/sys/dev/block/${major}:${minor}/size`, "utf8").trim()) * 512;
  } catch (e) {
    throw new OrchestratorError("orchestrator.runtime_failed", `cannot read the size of the served disk ${path}: ${errorMessage(e)}`, { path });
  }
}
