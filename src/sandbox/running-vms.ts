/**
 * What each sandbox VM of this node holds while it runs: its VMM handle, the disk daemon's export
 * of its root disk and of each volume drive, its network slot and its work dir
 * (`$home/sandboxes/<id>/`: the disk's upper, the VMM's files). Whatever part starts or stops a
 * VM records and frees these here, so a stop frees all of them on every path.
 */
import { rmSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import type { NetworkManager } from "../net/index.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import type { VolumeMount } from "../orchestrator/types.ts";
import type { DiskExport, DiskService } from "../storage/daemon/index.ts";
import type { DriveSpec, VmHandle } from "../vmm/index.ts";
import { serveVolumeDrives, type VmVolumesOptions } from "./volumes.ts";

/** The parts a VM's resources come from. */
export interface RunningVmsDeps {
  homePath: string;
  disks: DiskService;
  net: NetworkManager;
  /** Volume settings; absent: volume drives are refused. */
  volumes?: VmVolumesOptions;
  log: Logger;
}

/** The running VMs of this node and what each holds, by sandbox id. */
export class RunningVms {
  readonly #vms = new Map<string, VmHandle>();
  readonly #disks = new Map<string, DiskExport>();
  /** Volume drive exports per sandbox. */
  readonly #volumeDisks = new Map<string, DiskExport[]>();

  constructor(private readonly d: RunningVmsDeps) {}

  /** Work dir of sandbox `id` (`$home/sandboxes/<id>`). */
  workDir(id: string): string {
    return join(this.d.homePath, "sandboxes", id);
  }

  /** The VMM handle of sandbox `id`, while it runs. */
  vm(id: string): VmHandle | undefined {
    return this.#vms.get(id);
  }

  /**
   * The VMM handle of sandbox `id`.
   * @throws OrchestratorError `orchestrator.runtime_failed` when it has none (not running here)
   */
  requireVm(id: string): VmHandle {
    const vm = this.#vms.get(id);
    if (!vm) throw new OrchestratorError("orchestrator.runtime_failed", `no VM handle for sandbox ${id}`, { sandboxId: id });
    return vm;
  }

  /** Record the VMM of sandbox `id`. */
  setVm(id: string, vm: VmHandle): void {
    this.#vms.set(id, vm);
  }

  /** Serve sandbox `id`'s root disk: a fresh upper in `workDir` over `lowers` (kept for closeDisks). */
  async serveRoot(id: string, workDir: string, lowers: string[], virtualSize: number): Promise<DiskExport> {
    const disk = await this.d.disks.rootDisk({ id, lowers, sandboxDir: workDir, virtualSize });
    this.#disks.set(id, disk);
    return disk;
  }

  /**
   * Serve the volume drives of sandbox `id` (kept for closeDisks), in `mounts` order.
   * @throws OrchestratorError `orchestrator.bad_request` when this runtime has no volumes
   */
  async serveVolumes(id: string, workDir: string, mounts: VolumeMount[]): Promise<DriveSpec[]> {
    if (mounts.length === 0) return [];
    if (!this.d.volumes) throw new OrchestratorError("orchestrator.bad_request", "this runtime has no volume support configured", {});
    const { disks, drives } = await serveVolumeDrives(id, workDir, mounts, this.d.volumes);
    this.#volumeDisks.set(id, disks);
    return drives;
  }

  /** Disk daemon device ids of sandbox `id`'s volume drives, in drive order. */
  volumeExports(id: string): string[] {
    return (this.#volumeDisks.get(id) ?? []).map((d) => d.id);
  }

  /**
   * Take over sandbox `id`'s VM as a previous node left it: its VMM (attached), root disk and
   * volume drive exports (claimed), as a start records them.
   */
  adopt(id: string, vm: VmHandle, root: DiskExport, volumes: DiskExport[]): void {
    this.#vms.set(id, vm);
    this.#disks.set(id, root);
    if (volumes.length > 0) this.#volumeDisks.set(id, volumes);
  }

  /**
   * Let go of every VM without stopping it (`VmHandle.detach`) and forget the disk exports
   * without closing them: the next node adopts both (a node's detach). Never throws.
   */
  detachAll(): void {
    for (const [id, vm] of this.#vms) {
      try {
        vm.detach();
      } catch (e) {
        this.d.log.error({ sandboxId: id, err: e }, "VM detach failed");
      }
    }
    this.#vms.clear();
    this.#disks.clear();
    this.#volumeDisks.clear();
  }

  /** Ids of the sandboxes whose VM runs here. */
  ids(): string[] {
    return [...this.#vms.keys()];
  }

  /**
   * Resolves with a reason when sandbox `id`'s root disk or one of its volume drives is removed
   * under the guest (the orchestrator then fails the sandbox); never when it has no disk export.
   */
  drivesLost(id: string): Promise<string> {
    const disk = this.#disks.get(id);
    const drives = [...(disk ? [disk] : []), ...(this.#volumeDisks.get(id) ?? [])];
    return Promise.race(drives.map((d) => d.lost.then((why) => `${d === disk ? "root disk" : `volume drive ${d.id}`} lost: ${why}`)));
  }

  /** Stop the VMM of sandbox `id` (it exits; its handle is dropped). Throws what the VMM's stop throws. */
  async stopVm(id: string, vm: VmHandle): Promise<void> {
    await vm.stop();
    this.#vms.delete(id);
  }

  /** Stop serving the root disk and the volume drives of sandbox `id`. Never throws. */
  async closeDisks(id: string): Promise<void> {
    const d = this.#disks.get(id);
    this.#disks.delete(id);
    await d?.close().catch((e) => this.d.log.error({ sandboxId: id, err: e }, "disk export close failed"));
    for (const v of this.#volumeDisks.get(id) ?? []) await v.close().catch((e) => this.d.log.error({ sandboxId: id, err: e }, "volume export close failed"));
    this.#volumeDisks.delete(id);
  }

  /** Release sandbox `id`'s network slot after its VM stopped for a pause (a failure is logged). */
  async releaseSlot(id: string): Promise<void> {
    await this.d.net.release(id).catch((e) => this.d.log.warn({ sandboxId: id, err: e }, "slot release after pause failed"));
  }

  /**
   * Stop sandbox `id`'s VM (the handle given, or the one recorded), stop serving its disks,
   * release its slot when it has one, and (when `dropDisk`) delete its work dir. Never throws.
   */
  async teardown(id: string, dropDisk: boolean, vm: VmHandle | undefined = this.#vms.get(id)): Promise<void> {
    const releaseSlot = this.d.net.slotOf(id) !== undefined;
    if (vm) await vm.stop().catch((e) => this.d.log.error({ sandboxId: id, err: e }, "VM stop failed"));
    this.#vms.delete(id);
    await this.closeDisks(id);
    if (releaseSlot) await this.d.net.release(id).catch((e) => this.d.log.error({ sandboxId: id, err: e }, "slot release failed"));
    if (dropDisk) rmSync(this.workDir(id), { recursive: true, force: true });
  }

  /** Stop every VM and close every disk export (node shutdown). Never throws. */
  async closeAll(): Promise<void> {
    for (const [id, vm] of this.#vms) await vm.stop().catch((e) => this.d.log.error({ sandboxId: id, err: e }, "stop at close failed"));
    this.#vms.clear();
    for (const id of new Set([...this.#disks.keys(), ...this.#volumeDisks.keys()])) await this.closeDisks(id);
  }
}
