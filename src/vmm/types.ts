/**
 * Plain data shared by the VMM drivers (QEMU, Firecracker) and the orchestrator.
 * Sizes: memory in MiB; times in ms. Drivers throw `VmmError` (see ./errors.ts).
 * DRAFT contract laid by the skeleton: the VMM work may refine it; the orchestrator codes against it.
 */
import type { VmmRecord } from "./supervise.ts";

/** A virtio-blk drive. `path` is a regular file (or FUSE-served file, or block device). */
export interface DriveSpec {
  id: string;
  path: string;
  readOnly: boolean;
  isRoot: boolean;
  /**
   * Serial number the guest reads in /sys/block/vdX/serial (virtio-blk ID, 1-20 of [A-Za-z0-9]),
   * so it can find this drive whatever name the kernel gave it. QEMU sets it; Firecracker has no
   * such property (its drives keep their order: root first, then the list's order).
   */
  serial?: string;
}

/** Guest network: a tap that already exists inside the netns the VMM is started in. */
export interface NetSpec {
  /** Path of the network namespace the VMM process runs in, e.g. /var/run/netns/aenv-3. */
  netnsPath: string;
  tapName: string;
  /** Guest MAC, "02:xx:..". */
  mac: string;
  /** Guest address and gateway, passed on the kernel command line (ip=...). */
  guestIp: string;
  gatewayIp: string;
  /** Prefix length of the tap link, e.g. 30. */
  prefixLen: number;
}

/** Everything needed to boot one VM. */
export interface VmSpec {
  /** Sandbox id; names the work directory and the process. */
  id: string;
  /**
   * Directory owned by this VM (created if missing): console log, driver files. The QEMU driver
   * keeps guest RAM in `[qemu] memory_dir` and its QMP socket under `runtime_path/vmm/`.
   */
  workDir: string;
  kernelPath: string;
  /** Extra kernel command line appended to the driver's base arguments. */
  bootArgs: string;
  vcpus: number;
  memoryMiB: number;
  drives: DriveSpec[];
  net?: NetSpec;
  /**
   * Called with each line the guest writes on its serial console (drivers that capture the console
   * through a pipe: QEMU). Must not throw; called synchronously as output arrives.
   */
  onConsoleLine?: (line: string) => void;
  /**
   * Instance metadata served to the guest (Firecracker MMDS, JSON object; needs `net`).
   * Drivers without a metadata service ignore it.
   */
  metadata?: Record<string, unknown>;
}

/** Files of a VM snapshot in the Firecracker model: device state + guest memory. */
export interface SnapshotFiles {
  statePath: string;
  memPath: string;
  kind: "full" | "diff";
}

/**
 * Guest RAM as a snapshot of a paused VM captures it (`VmHandle.captureSnapshot`). Byte offsets
 * are guest-RAM offsets; valid until `release()`, and only while the VM neither resumes nor stops.
 * - `file`: the whole guest RAM is this file (holes and zero pages read as zeros). With
 *   `overParent`, the VM was restored from a memory image and the file must be compared with it
 *   (only differing blocks belong to a new layer).
 * - `changed`: the pages the VM changed since it was restored from its memory image, as sorted
 *   [start, end) ranges of whole 4 KiB pages; `read` copies their current bytes.
 */
export type MemoryCapture =
  | { kind: "file"; path: string; overParent: boolean; release(): void }
  | { kind: "changed"; ranges: Array<[number, number]>; read(buf: Uint8Array, offset: number): void; release(): void };

/** A running (or paused) VM owned by a driver. */
export interface VmHandle {
  readonly id: string;
  readonly pid: number;
  /** Resolves when the VMM process exits, with its exit code (null when killed by signal). */
  readonly exited: Promise<number | null>;
  /** Guest serial console output (a file that grows), when the driver captures it. */
  readonly consolePath?: string;
  /** ms from spawning the VMM until its control socket answered (QMP / API), when the driver measures it. */
  readonly spawnMs?: number;
  /** True while the vCPUs are stopped (a pause, a capture; a VM adopted in that state). */
  readonly paused: boolean;
  /**
   * The VMM process's start time (/proc/<pid>/stat field 22, clock ticks since boot) and its
   * control socket (QMP / Firecracker API), as its record has them: what proves to the next node
   * that the pid is still this VMM.
   */
  readonly startTime: number;
  readonly controlSocket: string;
  pause(): Promise<void>;
  resume(): Promise<void>;
  /**
   * Snapshot the paused VM: its device state (without guest RAM) goes to `statePath`, and the
   * result says where guest RAM is to be read from. The VM stays paused and may be resumed or
   * stopped after the capture is released. A restore takes `statePath` plus a file holding the
   * guest RAM (the memory image with the captured changes on top).
   * @throws VmmError `vmm.not_paused`, `vmm.snapshot_failed`
   */
  captureSnapshot(statePath: string): Promise<MemoryCapture>;
  /**
   * Tell the guest that `drive` (one the VM was started with, by id and host path) is now
   * `bytes` bytes long: a virtio config change, on which the guest kernel reads the disk's
   * capacity again. The host file or device must have that size already; nothing is truncated.
   * QEMU: QMP `block_resize` to the file's own size; Firecracker: `PATCH /drives/{drive_id}` with
   * the same `path_on_host` (post-boot drive update, ../shared/contracts/firecracker-api.yaml).
   * @throws VmmError `vmm.not_running` / `vmm.bad_state` (stopped), `vmm.qmp_error`,
   *   `vmm.firecracker_api`
   */
  driveResized(drive: Pick<DriveSpec, "id" | "path">, bytes: number): Promise<void>;
  /** Stop the VMM process (graceful first, then SIGKILL after the driver's timeout) and free its resources. */
  stop(): Promise<void>;
  /**
   * Let go of the VMM without stopping it, for the next node to `attach` (issue 27): control and
   * console connections close, the record and every file stay. The handle is dead afterwards
   * (`stop` does nothing; do not wait on its `exited`).
   */
  detach(): void;
}

/** A VMM driver. */
export interface VmmDriver {
  readonly name: "qemu" | "firecracker";
  /**
   * 16 hex chars naming what the driver gives every VM it boots beyond the spec: its kernel
   * command line and fixed devices. A template's or boot snapshot made under another key is made
   * again, so every sandbox gets today's machine (a restore itself follows the snapshot's devices).
   */
  readonly machineKey: string;
  boot(spec: VmSpec): Promise<VmHandle>;
  /** Start a VM from snapshot files; it starts paused unless `resume` is true. */
  restore(spec: VmSpec, files: SnapshotFiles, opts: { resume: boolean }): Promise<VmHandle>;
  /**
   * Take over a VMM a previous node of this runtime path started, from its record
   * (`readRecords`): `attached` with a handle like `boot`'s, or `lost` with the reason (../adopt.ts
   * `VmmLostReason`; a live VMM that cannot be adopted has been killed). Never throws for a
   * record that does not fit; the record of a lost VMM is for `reapLeftovers` to remove.
   */
  attach(rec: VmmRecord, opts?: AttachOptions): Promise<VmmAttachResult>;
}

/**
 * Why a recorded VMM cannot be adopted:
 * - `gone`: no process has the recorded pid any more, or it has exited (a zombie);
 * - `other_process`: the pid names another process now (start time or command line differ);
 * - `record_invalid`: the record lacks what adoption needs (written by an older node), names
 *   another driver, or another sandbox;
 * - `unresponsive`: the VMM is ours but its control socket did not answer;
 * - `bad_state`: the VMM answered but the VM is in a state nobody can continue from (a restore
 *   cut halfway, a guest stopped on an I/O error, a panic).
 * In the last three cases a live VMM that was proved ours has been killed (SIGKILL through its
 * pidfd) and its exit awaited, so its disk is no longer written when the caller takes it over.
 */
export type VmmLostReason = "gone" | "other_process" | "record_invalid" | "unresponsive" | "bad_state";

/** What `VmmDriver.attach` found. */
export type VmmAttachResult =
  | { kind: "attached"; vm: VmHandle }
  | { kind: "lost"; id: string; reason: VmmLostReason; detail: string };

/** Options of `VmmDriver.attach`. */
export interface AttachOptions {
  /** Called with each guest console line read from now on (QEMU), as `VmSpec.onConsoleLine`. */
  onConsoleLine?: (line: string) => void;
}
