/** Typed view of config `[snapshot]` (meaning and ranges in src/config/schema.ts). */
import { join } from "node:path";
import type { Config } from "../config/index.ts";

/** Settings of the snapshot repository. Times in ms. */
export interface SnapshotConfig {
  /** Local repository directory. */
  path: string;
  verifyDigests: boolean;
  gcGraceMs: number;
  /** 0 = no periodic collection. */
  gcIntervalMs: number;
}

/** Read `[snapshot]` (the schema has checked the ranges). */
export function snapshotConfig(cfg: Config): SnapshotConfig {
  const s = cfg.snapshot;
  return {
    path: s.path || join(cfg.home_path, "snapshots"),
    verifyDigests: s.verify_digests,
    gcGraceMs: s.gc_grace_secs * 1000,
    gcIntervalMs: s.gc_interval_secs * 1000,
  };
}
