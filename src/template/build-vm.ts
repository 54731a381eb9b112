/**
 * The port a template build runs its steps through: a VM booted from a stack of overlaybd layers
 * with envd inside. The sandbox assembly implements it (src/sandbox/build-vm.ts); the builder
 * only sees these plain calls.
 */

/** What a build VM boots from. */
export interface BuildVmSpec {
  /** Build id (names the VM's work directory and log lines). */
  id: string;
  /** overlaybd layers, lowest first, absolute paths (never written). */
  layers: string[];
  diskBytes: number;
  bootArgs: string;
  cpuCount: number;
  memoryMB: number;
  /** Aborts the boot (build cancelled / node shutting down). */
  signal: AbortSignal;
}

/** A command for the build VM. */
export interface VmCommand {
  /** Shell text run with the image's `/bin/sh -c` (a probe: the tools drive's shell, see `probe`). */
  script: string;
  /**
   * A ready probe: run with the tools drive's shell, its programs first on PATH, never the
   * image's userland (src/tools `probeCommand`). Steps and the start command leave it unset.
   */
  probe?: boolean;
  user: string;
  cwd?: string;
  envs?: Record<string, string>;
  /** Bound on the command, ms. */
  timeoutMs: number;
  /** Output as it comes (one call per chunk). */
  onOutput?: (stream: "stdout" | "stderr", text: string) => void;
}

/** A running build VM. */
export interface BuildVm {
  /** Run a command to its end. @returns exit code (a timeout kills it and reports -1) and the output tail. */
  run(c: VmCommand): Promise<{ exitCode: number; output: string }>;
  /** Start a command and leave it running (the template's start command). */
  spawn(c: Omit<VmCommand, "timeoutMs">): Promise<{ pid: number; done: Promise<{ exitCode: number; output: string }> }>;
  /** Copy a host file into the guest at an absolute path, owned by root. */
  upload(localPath: string, guestPath: string): Promise<void>;
  /**
   * Flush the guest's filesystem and write everything that changed on its disk since the VM
   * booted and differs from `parentLayers` (lowest first, absolute) as one committed overlaybd
   * layer at `outPath` (appears atomically).
   * @returns the layer's size in bytes.
   */
  checkpoint(outPath: string, parentLayers: string[]): Promise<number>;
  /**
   * Pause the VM and commit it as the snapshot of build `buildID` of `templateID` (device state,
   * guest memory, and its disk: the layers it booted from plus what was written since), then
   * stop it. Sandboxes of the build are restores of that snapshot: what runs in the guest now
   * (the start command) runs in them at once. Present when the launcher's `snapshotUsable` is.
   * `source.record` is called with the snapshot's id before it is published, so the caller's
   * record of the snapshots builds made has it even if the node dies right after.
   * @returns the snapshot's id and the guest memory bytes its memory layer holds
   */
  commitSnapshot?(source: { templateID: string; buildID: string; record(snapshotId: string): void }): Promise<{ snapshotId: string; memoryBytes: number }>;
  /** Stop the VM and free everything it holds. Idempotent, never throws. */
  stop(): Promise<void>;
}

/** Boots build VMs. */
export interface BuildVmLauncher {
  boot(spec: BuildVmSpec): Promise<BuildVm>;
  /**
   * Whether snapshot `id` is committed and a sandbox can still be restored from it (the node's
   * guest kernel and tools drive are the ones it was taken with): a cached finalize reuses it.
   * Absent: this launcher commits no snapshots; builds end in disk layers and sandboxes cold-boot.
   */
  snapshotUsable?(id: string): boolean;
  /** No build names snapshot `id` any more: remove it (kept hidden while sandboxes run from it). */
  releaseSnapshot?(id: string): void;
}
