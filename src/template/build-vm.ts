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
  /** Shell text run with `/bin/sh -c`. */
  script: string;
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
  /** Stop the VM and free everything it holds. Idempotent, never throws. */
  stop(): Promise<void>;
}

/** Boots build VMs. */
export interface BuildVmLauncher {
  boot(spec: BuildVmSpec): Promise<BuildVm>;
}
