/** Typed view of config `[snapshot]` and `[snapshot.s3]` (meaning and ranges in src/config/schema.ts). */
import { join } from "node:path";
import type { Config } from "../config/index.ts";
import { SnapshotError } from "./errors.ts";
import type { SnapshotKind } from "./manifest.ts";

const KINDS: readonly SnapshotKind[] = ["template", "user", "pause", "fork", "boot"];

/** Where and how to reach the S3-compatible object store of snapshots. */
export interface S3Settings {
  bucket: string;
  /** "" or ending in "/". */
  prefix: string;
  /** URL; undefined: AWS S3 of `region`. */
  endpoint: string | undefined;
  region: string;
  virtualHostedStyle: boolean;
  /** undefined: Bun's client reads S3_* / AWS_* environment variables. */
  accessKeyId: string | undefined;
  secretAccessKey: string | undefined;
  /** Kinds pushed after commit. */
  pushKinds: SnapshotKind[];
  /** Multipart part size, bytes. */
  partSizeBytes: number;
  uploadConcurrency: number;
  retries: number;
  /** Longest wait for pushes at shutdown, ms. */
  shutdownWaitMs: number;
  /** 0 = push what the store lacks only at start. */
  syncIntervalMs: number;
}

/** Settings of the snapshot repository. Times in ms. */
export interface SnapshotConfig {
  /** Local repository directory. */
  path: string;
  verifyDigests: boolean;
  gcGraceMs: number;
  /** 0 = no periodic collection. */
  gcIntervalMs: number;
  /** Bytes of local layer files kept when a remote is configured; 0 = no limit. */
  cacheMaxBytes: number;
  /** Memory images kept open after their last sandbox (`warm_images`); 0 = none. */
  warmImages: number;
  /** null: no object store. */
  s3: S3Settings | null;
}

/**
 * Read `[snapshot]` (the schema has checked types and ranges).
 * @throws SnapshotError `snapshot.bad_config` for `[snapshot.s3]` settings that cannot work
 *   together (an endpoint that is not an http(s) URL, half a credential pair, an unknown kind)
 */
export function snapshotConfig(cfg: Config): SnapshotConfig {
  const s = cfg.snapshot;
  return {
    path: s.path || join(cfg.home_path, "snapshots"),
    verifyDigests: s.verify_digests,
    gcGraceMs: s.gc_grace_secs * 1000,
    gcIntervalMs: s.gc_interval_secs * 1000,
    warmImages: s.warm_images,
    cacheMaxBytes: s.cache_max_bytes,
    s3: s.s3.bucket ? s3Settings(s.s3) : null,
  };
}

function s3Settings(c: Config["snapshot"]["s3"]): S3Settings {
  const bad = (key: string, why: string, value: unknown): never => {
    throw new SnapshotError("snapshot.bad_config", `[snapshot.s3] ${key}: ${why}`, { key: `snapshot.s3.${key}`, value });
  };
  if (!/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(c.bucket)) bad("bucket", "not a valid bucket name (3-63 of a-z 0-9 . -)", c.bucket);
  if (c.endpoint) {
    let u: URL | undefined;
    try {
      u = new URL(c.endpoint);
    } catch {
      // reported below
    }
    if (!u || (u.protocol !== "http:" && u.protocol !== "https:") || !u.host) bad("endpoint", "not an http(s) URL", c.endpoint);
  }
  if (Boolean(c.access_key_id) !== Boolean(c.secret_access_key)) bad(c.access_key_id ? "secret_access_key" : "access_key_id", "credentials need both the key id and the secret", "(hidden)");
  for (const k of c.push_kinds) if (!KINDS.includes(k as SnapshotKind)) bad("push_kinds", `unknown snapshot kind (one of ${KINDS.join(", ")})`, k);
  return {
    bucket: c.bucket,
    prefix: c.prefix,
    endpoint: c.endpoint || undefined,
    region: c.region,
    virtualHostedStyle: c.virtual_hosted_style,
    accessKeyId: c.access_key_id || undefined,
    secretAccessKey: c.secret_access_key || undefined,
    pushKinds: [...new Set(c.push_kinds as SnapshotKind[])],
    partSizeBytes: c.part_size_mib * 1024 * 1024,
    uploadConcurrency: c.upload_concurrency,
    retries: c.retries,
    shutdownWaitMs: c.shutdown_wait_ms,
    syncIntervalMs: c.sync_interval_secs * 1000,
  };
}
