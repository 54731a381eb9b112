/**
 * What the VM runtime is made of: the parts the composition root (factory.ts) builds and starts,
 * with the settings they run under. Shared by the runtime's front (vm-runtime.ts) and the build
 * VMs (build-vm.ts), which boot through the same parts.
 */
import type { NetworkManager } from "../net/index.ts";
import type { LocalRepository, SharedImages, SnapshotRemote } from "../snapshot/index.ts";
import type { DiskService } from "../storage/daemon/index.ts";
import type { VmmDriver } from "../vmm/index.ts";
import type { RestorePoolOptions } from "./restore-pool.ts";
import type { VmVolumesOptions } from "./volumes.ts";

/** The parts and settings of a VM runtime. Times in ms. */
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
  /** Bound on a template's ready command at sandbox start (cold boot). */
  readyTimeoutMs: number;
  /** Period of polling a template's ready command. */
  readyPollMs: number;
  /** Bound on one run of a template's ready command. */
  readyProbeTimeoutMs: number;
  /** The restore pool (`[pool.restore]`); absent or high watermark 0: none. */
  restorePool?: RestorePoolOptions;
  /** Cold boots restore boot snapshots (`[vm] boot_snapshots`, src/sandbox/boot-snapshot.ts). */
  bootSnapshots?: boolean;
  /**
   * `recover()` adopts the sandboxes a previous node left running (adoption.ts): it starts the
   * disk daemon (`disks` must be in adopt mode) and the network manager itself, keeping what
   * those sandboxes hold. Absent: nothing is adopted (every VMM a previous node left is
   * killed) and the caller starts both (tests that boot no VM leave them unstarted).
   */
  adoptAtStart?: boolean;
}
