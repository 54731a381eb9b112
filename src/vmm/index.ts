/**
 * VMM layer entry point for the orchestrator.
 * - `createDriver(cfg)`: the VMM driver this node uses: Firecracker when `[vm] driver` says so (or
 *   "auto" and the firecracker binary is found), else QEMU microvm (`src/vmm/qemu/`).
 * - `resolveKernelPath(cfg)`: the guest kernel to boot (`[kernel] path`, else the cached build).
 * - `reapLeftovers(runtimeDir)`: kill VMMs a crashed node left running; call once at start-up.
 *   Only the records under `<runtimeDir>/vmm/` are reaped: nodes on one host need distinct runtime paths.
 * - VMMs run in their own session (setsid): a Ctrl-C on the node's terminal does not reach them,
 *   the node's shutdown decides their fate (pause/snapshot or stop).
 * - `kernelIpArg`, `kernelClockArg`: command-line pieces every driver adds.
 * Shapes of specs and handles: ./types.ts. Errors: `VmmError` (./errors.ts).
 */
import { existsSync } from "node:fs";
import { get, type ConfigTable } from "../config/index.ts";
import { VmmError } from "./errors.ts";
import { kernelCacheKey, kernelCachePath, kernelFragment, kernelSourceVersion } from "./kernel/build.ts";
import { QemuDriver, type QemuDriverOptions } from "./qemu/driver.ts";
import type { VmmDriver } from "./types.ts";

export * from "./types.ts";
export { VmmError } from "./errors.ts";
export { kernelClockArg, kernelIpArg, prefixToNetmask } from "./bootargs.ts";
export { reapLeftovers, processStartTime, type VmmRecord } from "./supervise.ts";
export { QemuDriver, QemuVm, type QemuDriverOptions, type QemuVmState } from "./qemu/driver.ts";
export { buildKernel, hasPvhNote, type KernelArtifact } from "./kernel/build.ts";

/** The `[qemu]`/`[vm]` settings as QemuDriverOptions. */
export function qemuOptions(cfg: ConfigTable): QemuDriverOptions {
  const accel = get<string>(cfg, "qemu.accel");
  if (accel !== "auto" && accel !== "kvm" && accel !== "tcg") {
    throw new VmmError("vmm.bad_config", `qemu.accel must be auto, kvm or tcg, got ${accel}`, { accel });
  }
  return {
    binary: get<string>(cfg, "qemu.binary"),
    accel,
    cpu: get<string>(cfg, "qemu.cpu"),
    tscKhz: get<number>(cfg, "qemu.tsc_khz"),
    tcgTbSizeMiB: get<number>(cfg, "qemu.tcg_tb_size_mib"),
    runtimeDir: get<string>(cfg, "runtime_path"),
    memoryDir: get<string>(cfg, "qemu.memory_dir"),
    stopTimeoutMs: get<number>(cfg, "vm.stop_timeout_ms"),
    socketTimeoutMs: get<number>(cfg, "vm.socket_timeout_ms"),
    consoleMaxBytes: get<number>(cfg, "vm.console_max_bytes"),
    qmpTimeoutMs: get<number>(cfg, "qemu.qmp_timeout_ms"),
  };
}

function firecrackerBinary(cfg: ConfigTable): string | null {
  try {
    const bin = get<string>(cfg, "firecracker.binary");
    return bin.includes("/") ? (existsSync(bin) ? bin : null) : Bun.which(bin);
  } catch {
    return null;
  }
}

/**
 * The driver for this node. "firecracker" (or "auto" with the binary present) loads
 * `./firecracker/index.ts`, which exports `createFirecrackerDriver(cfg): VmmDriver`.
 * @throws VmmError `vmm.bad_config` for an unknown `[vm] driver`, `vmm.driver_unavailable`
 *   when Firecracker is requested but absent.
 */
export async function createDriver(cfg: ConfigTable): Promise<VmmDriver> {
  const want = get<string>(cfg, "vm.driver");
  if (want !== "auto" && want !== "qemu" && want !== "firecracker") {
    throw new VmmError("vmm.bad_config", `vm.driver must be auto, qemu or firecracker, got ${want}`, { driver: want });
  }
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
export function resolveKernelPath(cfg: ConfigTable): string {
  const explicit = get<string>(cfg, "kernel.path");
  let path = explicit;
  if (!path) {
    const ver = kernelSourceVersion(get<string>(cfg, "kernel.source_tarball"), get<string>(cfg, "kernel.source_package"));
    path = kernelCachePath(get<string>(cfg, "home_path"), kernelCacheKey(ver, kernelFragment()));
  }
  if (!existsSync(path)) {
    throw new VmmError("vmm.kernel_missing", `guest kernel ${path} not found (run \`agentenv kernel build\`)`, { path });
  }
  return path;
}

