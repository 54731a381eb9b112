/** Typed view of config `[firecracker]` plus the shared `[vm]` timeouts (defaults and documentation in config/default.toml). */
import { loadConfig, type Config } from "../../config/index.ts";

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

/** Read `[firecracker]` from a loaded config (default: the node's config); values were checked when it was loaded. */
export function firecrackerConfig(cfg: Config = loadConfig()): FirecrackerConfig {
  const fc = cfg.firecracker;
  return {
    binary: fc.binary,
    bootArgs: fc.boot_args,
    apiTimeoutMs: fc.api_timeout_ms,
    socketTimeoutMs: cfg.vm.socket_timeout_ms,
    stopTimeoutMs: cfg.vm.stop_timeout_ms,
    trackDirtyPages: fc.track_dirty_pages,
    mmdsVersion: fc.mmds_version,
    driveCacheType: fc.drive_cache_type,
    driveIoEngine: fc.drive_io_engine,
    entropyDevice: fc.entropy_device,
  };
}
