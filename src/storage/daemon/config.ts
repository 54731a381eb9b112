/** Typed view of config `[disk]` (defaults in config/default.toml). */
import { loadConfig, type Config } from "../../config/index.ts";

/** Settings of the disk service. */
export interface DiskConfig {
  /** FUSE reader threads per export. */
  fuseWorkers: number;
  /** Largest FUSE READ/WRITE, bytes. */
  fuseMaxWrite: number;
  /** FOPEN_DIRECT_IO on served files. */
  fuseDirectIo: boolean;
  /** Kernel FUSE request timeout, seconds (0 = none). */
  fuseRequestTimeoutSec: number;
  /** Longest wait for a serving child to report ready, ms. */
  readyTimeoutMs: number;
  /** Longest wait for a serving child to exit after unmount before SIGTERM (and as long again before SIGKILL), ms. */
  stopTimeoutMs: number;
  /** How many times a dead serving child is replaced over one export's life. */
  maxRestarts: number;
}

/** Read `[disk]` from a loaded config (default: the node's config). */
export function diskConfig(cfg: Config = loadConfig()): DiskConfig {
  return {
    fuseWorkers: cfg.disk.fuse_workers,
    fuseMaxWrite: cfg.disk.fuse_max_write,
    fuseDirectIo: cfg.disk.fuse_direct_io,
    fuseRequestTimeoutSec: cfg.disk.fuse_request_timeout_s,
    readyTimeoutMs: cfg.disk.ready_timeout_ms,
    stopTimeoutMs: cfg.disk.stop_timeout_ms,
    maxRestarts: cfg.disk.max_restarts,
  };
}
