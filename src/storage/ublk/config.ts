/** Typed view of config `[ublk]` (keys, ranges and meaning in src/config/schema.ts). */
import { loadConfig, type Config } from "../../config/index.ts";
import { UblkError } from "./errors.ts";

/** Settings of ublk devices. */
export interface UblkConfig {
  /** Queues (worker threads) per device. */
  queues: number;
  /** Requests in flight per queue. */
  queueDepth: number;
  /** Largest request payload, bytes. */
  maxIoBytes: number;
  /** log2 of the logical block size, bytes. */
  logicalBlockShift: number;
  /** log2 of the physical block size, bytes. */
  physicalBlockShift: number;
  /** Ask for user recovery where the kernel offers it. */
  userRecovery: boolean;
  /** Longest wait for one control command, ms. */
  controlTimeoutMs: number;
  /** Longest wait for a dead server's device to become recoverable, ms. */
  recoveryWaitMs: number;
  /** CoW chunk size, bytes. */
  cowChunkBytes: number;
}

/**
 * Check a UblkConfig built or changed outside the schema (command-line overrides): the schema's
 * ranges plus the rule the schema cannot state (physical block ≥ logical block).
 * @throws UblkError `ublk.bad_config` naming the field
 */
export function checkUblkConfig(c: UblkConfig): UblkConfig {
  const bad = (field: string, value: unknown, why: string): never => {
    throw new UblkError("ublk.bad_config", `ublk.${field} = ${JSON.stringify(value)}: ${why}`, { field, value });
  };
  const intIn = (field: string, v: number, lo: number, hi: number) => (!Number.isInteger(v) || v < lo || v > hi) && bad(field, v, `must be an integer in ${lo}..${hi}`);
  intIn("queues", c.queues, 1, 16);
  intIn("queue_depth", c.queueDepth, 1, 4096);
  intIn("max_io_bytes", c.maxIoBytes, 4096, 16 << 20);
  if (c.maxIoBytes % 4096) bad("max_io_bytes", c.maxIoBytes, "must be a multiple of 4096");
  intIn("logical_block_shift", c.logicalBlockShift, 9, 12);
  intIn("physical_block_shift", c.physicalBlockShift, c.logicalBlockShift, 12);
  intIn("control_timeout_ms", c.controlTimeoutMs, 1, 86_400_000);
  intIn("recovery_wait_ms", c.recoveryWaitMs, 1, 86_400_000);
  const C = c.cowChunkBytes;
  if (!Number.isInteger(C) || C < 4096 || C > 4 << 20 || (C & (C - 1)) !== 0) bad("cow_chunk_bytes", C, "must be a power of two in 4096..4194304");
  return c;
}

/**
 * Read `[ublk]` from a loaded config (default: the node's config).
 * @throws UblkError `ublk.bad_config` when physical_block_shift < logical_block_shift
 */
export function ublkConfig(cfg: Config = loadConfig()): UblkConfig {
  const u = cfg.ublk;
  return checkUblkConfig({
    queues: u.queues,
    queueDepth: u.queue_depth,
    maxIoBytes: u.max_io_bytes,
    logicalBlockShift: u.logical_block_shift,
    physicalBlockShift: u.physical_block_shift,
    userRecovery: u.user_recovery,
    controlTimeoutMs: u.control_timeout_ms,
    recoveryWaitMs: u.recovery_wait_ms,
    cowChunkBytes: u.cow_chunk_bytes,
  });
}
