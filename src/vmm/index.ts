/**
 * VMM layer entry point for the orchestrator.
 * - `createDriver(cfg)`: the VMM driver this node uses: Firecracker when `[vm] driver` says so (or
 *   "auto" and the firecracker binary is found), else QEMU microvm (`src/vmm/qemu/`).
 * - `resolveKernelPath(cfg)`: the guest kernel to boot (`[kernel] path`, else the cached build).
 * - `readRecords(runtimeDir)`: the VMMs a previous node of this runtime path left (records by id);
 *   `driver.attach(record, { onConsoleLine })` adopts one (`attached` with a handle, or `lost` with
 *   the reason: ./adopt.ts); `handle.detach()` lets one go for the next node.
 * - `reapLeftovers(runtimeDir, { keep })`: kill VMMs a crashed node left running, but those whose id
 *   is in `keep` (adopted); call once at start-up, after the attaches.
 *   Only the records under `<runtimeDir>/vmm/` are reaped: nodes on one host need distinct runtime paths.
 * - VMMs run in their own session (setsid): a Ctrl-C on the node's terminal does not reach them,
 *   the node's shutdown decides their fate (pause/snapshot or stop).
 * - `kernelIpArg`, `kernelClockArg`: command-line pieces every driver adds.
 * - `applyKsm(setup)`: `[vm] ksm` (kernel samepage merging) at node start, before any VMM is
 *   spawned; `ksmGauges()`: the host's KSM counters for /metrics (./ksm.ts).
 * Shapes of specs and handles: ./types.ts. Errors: `VmmError` (./errors.ts).
 */
import { existsSync } from "node:fs";
import { type Config } from "../config/index.ts";
import { VmmError } from "./errors.ts";
import { kernelCacheKey, kernelCachePath, kernelFragment, kernelSourceVersion } from "./kernel/build.ts";
import { QemuDriver, type QemuDriverOptions } from "./qemu/driver.ts";
import type { VmmDriver } from "./types.ts";

export * from "./types.ts";
export { VmmError } from "./errors.ts";
export { kernelClockArg, kernelIpArg, prefixToNetmask } from "./bootargs.ts";
export { readRecords, reapLeftovers, processStartTime, type VmmRecord } from "./supervise.ts";
export { QemuDriver, QemuVm, type QemuDriverOptions, type QemuVmState } from "./qemu/driver.ts";
export { buildKernel, hasPvhNote, type KernelArtifact } from "./kernel/build.ts";
export { applyKsm, ksmGauges, type KsmApplied, type KsmSetup } from "./ksm.ts";

/** The `[qemu]`/`[vm]` settings as QemuDriverOptions. */
export function qemuOptions(cfg: Config): QemuDriverOptions {
  return {
    binary: cfg.qemu.binary,
    accel: cfg.qemu.accel,
    cpu: cfg.qemu.cpu,
    tscKhz: cfg.qemu.tsc_khz,
    tcgTbSizeMiB: cfg.qemu.tcg_tb_size_mib,
    tcgTbSizeRestoreMiB: cfg.qemu.tcg_tb_size_restore_mib,
    runtimeDir: cfg.runtime_path,
    memoryDir: cfg.qemu.memory_dir,
    stopTimeoutMs: cfg.vm.stop_timeout_ms,
    socketTimeoutMs: cfg.vm.socket_timeout_ms,
    consoleMaxBytes: cfg.vm.console_max_bytes,
    qmpTimeoutMs: cfg.qemu.qmp_timeout_ms,
    freePageReporting: cfg.qemu.free_page_reporting,
    memMerge: cfg.vm.ksm !== "off",
  };
}

function firecrackerBinary(cfg: Config): string | null {
  try {
    const bin = cfg.firecracker.binary;
    return bin.includes("/") ? (existsSync(bin) ? bin : null) : Bun.which(bin);
  } catch {
    return null;
  }
}

/**
 * The driver for this node. "firecracker" (or "auto" with the binary present) loads
 * `./firecracker/index.ts`, which exports `createFirecrackerDriver(cfg): VmmDriver`.
 * @throws VmmError `vmm.driver_unavailable` when Firecracker is requested but absent.
 */
export async function createDriver(cfg: Config): Promise<VmmDriver> {
  const want = cfg.vm.driver;
  const fc = want === "qemu" ? null : firecrackerBinary(cfg);
  if (want === "firecracker" && !fc) throw new VmmError("vmm.driver_unavailable", "firecracker binary not found", { driver: want });
  if (fc) {
    const { createFirecrackerDriver } = await import("./firecracker/index.ts"); // loaded only when used
    return createFirecrackerDriver(cfg);
  }
  return new QemuDriver(qemuOptions(cfg));
}

/**
 * Path of the guest kernel: `[kernel] path` when set, else `$home_path/kernels/<key>/vmlinux`
 * built by `agentenv kernel build` for the configured source and the shipped fragment.
 * @throws VmmError `vmm.kernel_missing` when that file does not exist.
 */
export function resolveKernelPath(cfg: Config): string {
  const explicit = cfg.kernel.path;
  let path = explicit;
  if (!path) {
    const ver = kernelSourceVersion(cfg.kernel.source_tarball, cfg.kernel.source_package);
    path = kernelCachePath(cfg.home_path, kernelCacheKey(ver, kernelFragment()));
  }
  if (!existsSync(path)) {
    throw new VmmError("vmm.kernel_missing", `guest kernel ${path} not found (run \`agentenv kernel build\`)`, { path });
  }
  return path;
}

