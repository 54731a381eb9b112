/** Typed view of config `[disk]` and `[pool.block]` (defaults in config/default.toml). */
import { loadConfig, type Config } from "../../config/index.ts";
import type { DaemonSettings } from "./daemon.ts";
import { DiskError } from "../errors.ts";
import type { BlockPoolSettings } from "./manager.ts";
import { ublkConfig, type UblkConfig } from "../ublk/index.ts";

/** Settings of the disk service. */
export interface DiskConfig {
  /** Export engine: "auto" (ublk when /dev/ublk-control exists, else FUSE), "ublk" or "fuse". */
  export: "auto" | "ublk" | "fuse";
  /** FUSE reader threads of the daemon, shared by every export (1..16). */
  fuseThreads: number;
  /** Largest FUSE READ/WRITE, bytes. */
  fuseMaxWrite: number;
  /** Answer large READs with splice(2). */
  fuseSplice: boolean;
  /** Readahead window of each FUSE mount, KiB (0 = the kernel's 128 KiB). */
  fuseReadAheadKb: number;
  /** FOPEN_DIRECT_IO on served files. */
  fuseDirectIo: boolean;
  /** Kernel FUSE request timeout, seconds (0 = none). */
  fuseRequestTimeoutSec: number;
  /** Longest wait for a started daemon to answer, ms. */
  readyTimeoutMs: number;
  /** Longest wait for the daemon to exit after `shutdown` before SIGTERM (and as long again before SIGKILL), ms. */
  stopTimeoutMs: number;
  /** How many times a daemon that died is started again over one node's life. */
  maxRestarts: number;
  /** Longest wait for the answer to one request, ms. */
  requestTimeoutMs: number;
  /** Largest protocol frame, bytes. */
  maxFrameBytes: number;
  /** Warm pool of pre-created exports (`[pool.block]`). */
  pool: BlockPoolSettings;
  /** ublk devices (`[ublk]`). */
  ublk: UblkConfig;
}

/**
 * Read `[disk]` and `[pool.block]` from a loaded config (default: the node's config).
 * @throws DiskError `disk.bad_spec` when the pool's watermarks are out of order; UblkError `ublk.bad_config`
 */
export function diskConfig(cfg: Config = loadConfig()): DiskConfig {
  const d = cfg.disk;
  const b = cfg.pool.block;
  const pool: BlockPoolSettings = { enabled: b.enabled, lowWatermark: b.low_watermark, highWatermark: b.high_watermark };
  if (pool.highWatermark < pool.lowWatermark) {
    throw new DiskError("disk.bad_spec", "[pool.block] needs low_watermark <= high_watermark", { field: "pool.block", value: { low: pool.lowWatermark, high: pool.highWatermark } });
  }
  return {
    export: d.export,
    fuseThreads: d.fuse_threads,
    fuseMaxWrite: d.fuse_max_write,
    fuseSplice: d.fuse_splice,
    fuseReadAheadKb: d.fuse_read_ahead_bytes / 1024,
    fuseDirectIo: d.fuse_direct_io,
    fuseRequestTimeoutSec: d.fuse_request_timeout_s,
    readyTimeoutMs: d.ready_timeout_ms,
    stopTimeoutMs: d.stop_timeout_ms,
    maxRestarts: d.max_restarts,
    requestTimeoutMs: d.request_timeout_ms,
    maxFrameBytes: d.max_frame_bytes,
    pool,
    ublk: ublkConfig(cfg),
  };
}

/** What a daemon on `dir` runs with, from the disk config. */
export function daemonSettings(c: DiskConfig, dir: string): DaemonSettings {
  return {
    dir,
    export: c.export,
    fuse: { threads: c.fuseThreads, maxWrite: c.fuseMaxWrite, requestTimeoutSec: c.fuseRequestTimeoutSec, directIo: c.fuseDirectIo, splice: c.fuseSplice, readAheadKb: c.fuseReadAheadKb },
    ublk: c.ublk,
    pool: c.pool,
    maxFrameBytes: c.maxFrameBytes,
    drainTimeoutMs: c.requestTimeoutMs,
  };
}
