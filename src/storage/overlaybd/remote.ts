/**
 * Remote layers as the node opens them: a registry blob behind the bounded block cache, with
 * limits from the `[overlaybd]` config section, and credentials from a docker-style
 * `{"auths": {...}}` file (overlaybd's cred.json: a key matches the blob URL's host, or
 * host/segment, host/segment/segment..., the longest match winning).
 */
import { readFileSync } from "node:fs";
import { type Config } from "../../config/index.ts";
import type { Backend } from "./backend.ts";
import { BlockCache } from "./cache.ts";
import { fail } from "./errors.ts";
import type { RemoteOpener } from "./imageconfig.ts";
import { RegistryBlob, type RegistryOptions } from "./registry.ts";

/** Username and password for one registry. */
export interface Credentials {
  username: string;
  password: string;
}

/**
 * Find credentials for `url` in a parsed `{"auths": {...}}` document.
 * Entries hold `username`/`password` or `auth` = base64("user:pass").
 * @returns the credentials of the longest matching key, or null
 */
export function findCredentials(doc: unknown, url: string): Credentials | null {
  const auths = (doc as { auths?: Record<string, { username?: string; password?: string; auth?: string }> })?.auths;
  if (!auths || typeof auths !== "object") return null;
  const u = new URL(url);
  const segs = u.pathname.split("/").filter(Boolean);
  const keys = [u.host];
  for (let i = 1; i <= segs.length; i++) keys.push(`${u.host}/${segs.slice(0, i).join("/")}`);
  for (const k of keys.reverse()) {
    const e = auths[k] ?? auths[`${u.protocol}//${k}`];
    if (!e) continue;
    if (e.username !== undefined) return { username: e.username, password: e.password ?? "" };
    if (e.auth) {
      const s = Buffer.from(e.auth, "base64").toString();
      const i = s.indexOf(":");
      if (i > 0) return { username: s.slice(0, i), password: s.slice(i + 1) };
    }
  }
  return null;
}

/**
 * A `RemoteOpener` for `openImageConfig`: registry blob + block cache sized by config
 * (`overlaybd.cache_size_bytes`, `cache_block_size`, `registry_retries`, `registry_timeout_ms`,
 * `registry_token_ttl_ms`). `credFile` is an optional auths JSON file.
 * @throws OverlaybdError `bad_credentials` when the file cannot be read or parsed
 */
export function remoteOpener(cfg: Config, credFile?: string): RemoteOpener {
  let doc: unknown = null;
  if (credFile) {
    try {
      doc = JSON.parse(readFileSync(credFile, "utf8"));
    } catch (e) {
      fail("bad_credentials", `cannot read credentials: ${(e as Error).message}`, { file: credFile });
    }
  }
  return async (url: string, size: number | undefined): Promise<Backend> => {
    const creds = findCredentials(doc, url);
    const opts: RegistryOptions = {
      ...(creds ?? {}),
      retries: cfg.overlaybd.registry_retries,
      timeoutMs: cfg.overlaybd.registry_timeout_ms,
      tokenTtlMs: cfg.overlaybd.registry_token_ttl_ms,
    };
    const blob = await RegistryBlob.open(url, opts, size);
    return new BlockCache(blob, { blockSize: cfg.overlaybd.cache_block_size, capacityBytes: cfg.overlaybd.cache_size_bytes });
  };
}
