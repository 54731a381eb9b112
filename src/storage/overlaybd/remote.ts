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
import { logger } from "../../observability/log.ts";
import { errorMessage } from "../../util/error.ts";

const log = logger("overlaybd");

/** Username and password for one registry, or an identity (OAuth2 refresh) token. */
export interface Credentials {
  username: string;
  password: string;
  identityToken?: string;
}

/**
 * How remote blobs are reached besides their URL (the node's `[image]` settings, made by
 * src/image `registryAccess`): where else a blob can be read (mirrors, tried in order before the
 * URL itself, or instead of it), through which proxy, with which extra CAs.
 */
export interface RemoteAccess {
  /** URLs to try for `url`, in order (mirrors, then `url` unless its registry is mirror-only). */
  candidates(url: string): string[];
  /** Proxy for `url`, or false to go directly. */
  proxyFor(url: string): string | false;
  /** Extra PEM CA certificates. */
  ca: string[];
}

/**
 * Find credentials for `url` in a parsed `{"auths": {...}}` document.
 * Entries hold `username`/`password` or `auth` = base64("user:pass").
 * @returns the credentials of the longest matching key, or null
 */
export function findCredentials(doc: unknown, url: string): Credentials | null {
  const auths = (doc as { auths?: Record<string, { username?: string; password?: string; auth?: string; identitytoken?: string }> })?.auths;
  if (!auths || typeof auths !== "object") return null;
  const u = new URL(url);
  const segs = u.pathname.split("/").filter(Boolean);
  const keys = [u.host];
  for (let i = 1; i <= segs.length; i++) keys.push(`${u.host}/${segs.slice(0, i).join("/")}`);
  for (const k of keys.reverse()) {
    const e = auths[k] ?? auths[`${u.protocol}//${k}`];
    if (!e) continue;
    const token = typeof e.identitytoken === "string" && e.identitytoken ? { identityToken: e.identitytoken } : {};
    if (e.username !== undefined) return { username: e.username, password: e.password ?? "", ...token };
    if (e.auth) {
      const s = Buffer.from(e.auth, "base64").toString();
      const i = s.indexOf(":");
      if (i > 0) return { username: s.slice(0, i), password: s.slice(i + 1), ...token };
    }
    if (token.identityToken) return { username: "", password: "", ...token };
  }
  return null;
}

/**
 * A `RemoteOpener` for `openImageConfig`: registry blob + block cache sized by config
 * (`overlaybd.cache_size_bytes`, `cache_block_size`, `registry_retries`, `registry_timeout_ms`,
 * `registry_token_ttl_ms`). `credFile` is an optional auths JSON file; `access` adds mirrors
 * (a candidate that cannot be opened is logged and the next one tried), the proxy and CAs.
 * @throws OverlaybdError `bad_credentials` when the file cannot be read or parsed
 */
export function remoteOpener(cfg: Config, credFile?: string, access?: RemoteAccess): RemoteOpener {
  let doc: unknown = null;
  if (credFile) {
    try {
      doc = JSON.parse(readFileSync(credFile, "utf8"));
    } catch (e) {
      // a JSON parse error quotes the text near the fault (credentials): only name the kind of fault
      fail("bad_credentials", `cannot read credentials: ${e instanceof SyntaxError ? `${credFile} is not valid JSON` : errorMessage(e)}`, { file: credFile });
    }
  }
  return async (url: string, size: number | undefined): Promise<Backend> => {
    const candidates = access?.candidates(url) ?? [url];
    let last: unknown;
    for (const [i, u] of candidates.entries()) {
      const creds = findCredentials(doc, u);
      const opts: RegistryOptions = {
        ...(creds ?? {}),
        retries: cfg.overlaybd.registry_retries,
        timeoutMs: cfg.overlaybd.registry_timeout_ms,
        tokenTtlMs: cfg.overlaybd.registry_token_ttl_ms,
        ...(access ? { proxy: access.proxyFor(u), ca: access.ca } : {}),
      };
      try {
        const blob = await RegistryBlob.open(u, opts, size);
        return new BlockCache(blob, { blockSize: cfg.overlaybd.cache_block_size, capacityBytes: cfg.overlaybd.cache_size_bytes });
      } catch (e) {
        last = e;
        if (i + 1 < candidates.length) log.warn({ url: u, next: candidates[i + 1], err: errorMessage(e) }, "registry blob endpoint failed, trying the next");
      }
    }
    throw last;
  };
}
