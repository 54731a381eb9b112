/** Typed view of config `[firecracker]` plus the shared `[vm]` timeouts (defaults and documentation in config/default.toml). */
import { get, loadConfig, type ConfigTable } from "../../config/index.ts";
import { VmmError } from "../errors.ts";

/** Settings of the Firecracker driver. */
export interface FirecrackerConfig {
  /** Path of the `firecracker` executable. */
  binary: string;
  /** Kernel command line the driver starts from (the spec's bootArgs and ip= are appended). */
  bootArgs: string;
  /** Longest wait for one API request, ms. */
  apiTimeoutMs: number;
  /** Longest wait for the API socket after spawn, ms (`[vm] socket_timeout_ms`). */
  socketTimeoutMs: number;
  /** Longest wait for the process to exit after SIGTERM before SIGKILL, ms (`[vm] stop_timeout_ms`). */
  stopTimeoutMs: number;
  /** KVM dirty-page tracking (needed for Diff snapshots); set at boot and again on load. */
  trackDirtyPages: boolean;
  /** MMDS version, "V1" or "V2". */
  mmdsVersion: "V1" | "V2";
  /** Drive cache type: "Unsafe" (no flush) or "Writeback" (guest flush → host fsync). */
  driveCacheType: "Unsafe" | "Writeback";
  /** Drive I/O engine: "Sync" or "Async" (io_uring). */
  driveIoEngine: "Sync" | "Async";
  /** Attach a virtio-rng device (PUT /entropy). */
  entropyDevice: boolean;
}

/**
 * Read `[firecracker]` from a loaded config (default: the node's config).
 * @throws VmmError `vmm.bad_config` for a value outside its allowed set or range
 */
export function firecrackerConfig(cfg: ConfigTable = loadConfig()): FirecrackerConfig {
  const oneOf = <T extends string>(key: string, allowed: readonly T[]): T => {
    const v = get<string>(cfg, `firecracker.${key}`);
    if (!(allowed as readonly string[]).includes(v)) {
      throw new VmmError("vmm.bad_config", `firecracker.${key} must be one of ${allowed.join(", ")}, got ${JSON.stringify(v)}`, { key: `firecracker.${key}`, value: v });
    }
    return v as T;
  };
  const ms = (key: string): number => {
    const v = get<number>(cfg, key);
    if (!Number.isInteger(v) || v <= 0) throw new VmmError("vmm.bad_config", `${key} must be a positive integer (ms), got ${v}`, { key, value: v });
    return v;
  };
  return {
    binary: get<string>(cfg, "firecracker.binary"),
    bootArgs: get<string>(cfg, "firecracker.boot_args"),
    apiTimeoutMs: ms("firecracker.api_timeout_ms"),
    socketTimeoutMs: ms("vm.socket_timeout_ms"),
    stopTimeoutMs: ms("vm.stop_timeout_ms"),
    trackDirtyPages: get<boolean>(cfg, "firecracker.track_dirty_pages"),
    mmdsVersion: oneOf("mmds_version", ["V1", "V2"] as const),
    driveCacheType: oneOf("drive_cache_type", ["Unsafe", "Writeback"] as const),
    driveIoEngine: oneOf("drive_io_engine", ["Sync", "Async"] as const),
    entropyDevice: get<boolean>(cfg, "firecracker.entropy_device"),
  };
}
