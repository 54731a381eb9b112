/**
 * The QEMU driver's settings, shared by the driver (driver.ts) and the VM handles it makes
 * (vm.ts).
 */

/** Settings of the QEMU driver (from the `[qemu]` and `[vm]` config sections). */
export interface QemuDriverOptions {
  /** qemu-system-x86_64 path or name on PATH. */
  binary: string;
  accel: "auto" | "kvm" | "tcg";
  /** -cpu model; "max" under TCG (Bun needs x86-64-v2). Under KVM "host" is used when this is "max". */
  cpu: string;
  /** tsc_early_khz for TCG; 0 reads the host's /proc/cpuinfo. */
  tscKhz: number;
  /** TCG translation cache in MiB; 0 keeps QEMU's default (the largest per-VM memory cost under TCG). */
  tcgTbSizeMiB: number;
  /** The same for a VM restored from a snapshot (`restore`); 0 keeps QEMU's default. */
  tcgTbSizeRestoreMiB: number;
  /** Where VMM records, QMP and console sockets live (`<runtimeDir>/vmm/`). */
  runtimeDir: string;
  /** Directory of the guest RAM files of booted VMs (`<memoryDir>/<id>.mem`); tmpfs is best. */
  memoryDir: string;
  stopTimeoutMs: number;
  socketTimeoutMs: number;
  /** Guest console log rotation threshold in bytes (`<workDir>/console.log`, one `.1` kept). */
  consoleMaxBytes: number;
  qmpTimeoutMs: number;
  /**
   * Boot VMs with a free page reporting balloon (args.ts `BALLOON_DEVICE`), so memory their
   * guests free goes back to the host. A restore has the device when its snapshot's VM had it.
   */
  freePageReporting: boolean;
  /**
   * Mark guest RAM mergeable for the host's KSM (`-machine mem-merge=on`; `[vm] ksm` "guest" or
   * "all"). Off: `mem-merge=off`, so a host whose ksmd runs for other processes never merges
   * sandboxes' memory. Not part of the machine key: it changes no guest-visible state.
   */
  memMerge: boolean;
}
