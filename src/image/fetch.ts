/**
 * Fetching an image from the first endpoint that has it: the registry's mirrors in order, then
 * the registry itself unless it is mirror-only (src/image/settings.ts). An endpoint that cannot
 * be reached, times out, refuses the credentials, has no such image or fails otherwise is named
 * in the node's log and the pull's progress, and the next one is tried; an endpoint that serves
 * bytes other than the digest they must have (a manifest not matching the pinned @sha256:, a
 * blob not matching its digest) ends the pull: that is a broken or hostile mirror the operator
 * must see, not an outage to route around.
 *
 * Per pull, in its private work directory: the credentials file skopeo reads (the entries of
 * `[image] auth_file` for the hosts this pull may reach, and the build's own credentials for the
 * image's registry only: never sent to a mirror), the CA directory, the proxy variables; every
 * secret is redacted from what skopeo prints.
 */
import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { logger } from "../observability/log.ts";
import { errorCode, errorMessage } from "../util/error.ts";
import { proxyEnv } from "../util/proxy.ts";
import { authFor, readAuthFile, redact, secretsOf, writeContainersAuth, type AuthEntries, type RegistryAuth } from "./auth.ts";
import { ImageError, type ImageErrorCode } from "./errors.ts";
import { formatImageRef, type ImageRef } from "./reference.ts";
import { caFiles, endpointsFor, type Endpoint, type RegistrySettings } from "./settings.ts";
import { copyImage, digestMismatch, inspectManifest, type ServedManifest, type SkopeoContext } from "./skopeo.ts";

const log = logger("image");

/** Failures after which the next endpoint is tried. */
const FALL_THROUGH: ReadonlySet<string> = new Set<ImageErrorCode>(["image.unreachable", "image.timeout", "image.not_found", "image.auth", "image.tls", "image.pull_failed"]);

/** What one pull asks of its endpoints. */
export interface FetchRequest {
  ref: ImageRef;
  /** Credentials the build brought, for the image's own registry. */
  credentials?: { username: string; password: string };
  registries: RegistrySettings;
  /** The pull's private work directory (0700): the credentials file and the CA copies go there. */
  work: string;
  toolTimeoutMs: number;
  manifestTimeoutMs: number;
  progress: (line: string) => void;
  signal?: AbortSignal;
}

/** Where the image came from and what it is. */
export interface Fetched {
  endpoint: Endpoint;
  manifest: ServedManifest;
  /** false: `cached` said the digest is converted already; nothing was copied. */
  copied: boolean;
}

/**
 * The skopeo context of a pull: credentials for the hosts of `endpoints`, the CA directory, the
 * proxy, the secrets to redact.
 * @throws ImageError `image.bad_config` when `[image] auth_file` or `ca_path` cannot be read
 */
export function pullContext(req: FetchRequest, endpoints: Endpoint[]): SkopeoContext {
  const entries: AuthEntries = {};
  if (req.registries.authFile) {
    const file = readAuthFile(req.registries.authFile);
    if (file.helpers.length) log.warn({ authFile: req.registries.authFile, ignored: file.helpers }, "the auth file names credential helpers; only its auths entries are used");
    for (const e of endpoints) {
      const hit = authFor(file.entries, e.host, e.repository);
      if (hit) entries[e.host] = hit;
    }
  }
  // the build's credentials belong to the image's registry: never sent to a mirror
  if (req.credentials) entries[req.ref.registry] = { username: req.credentials.username, password: req.credentials.password };
  const ctx: SkopeoContext = {
    env: proxyEnv(req.registries.proxy),
    secrets: [...secretsOf(Object.values(entries) as RegistryAuth[]), ...proxySecrets(req.registries)],
    manifestTimeoutMs: req.manifestTimeoutMs,
    toolTimeoutMs: req.toolTimeoutMs,
    ...(req.signal ? { signal: req.signal } : {}),
  };
  if (Object.keys(entries).length > 0) {
    ctx.authFile = join(req.work, "auth.json");
    writeContainersAuth(ctx.authFile, entries);
  }
  if (req.registries.caPath) {
    ctx.certDir = join(req.work, "certs");
    mkdirSync(ctx.certDir, { mode: 0o700 });
    caFiles(req.registries.caPath).forEach((f, i) => copyFileSync(f, join(ctx.certDir!, `ca-${i}.crt`)));
  }
  return ctx;
}

/** The password of a proxy URL, when it carries one. */
function proxySecrets(s: RegistrySettings): string[] {
  const out: string[] = [];
  for (const u of [s.proxy.httpsProxy, s.proxy.httpProxy]) {
    try {
      const p = u ? decodeURIComponent(new URL(u).password) : "";
      if (p) out.push(p);
    } catch {
      // checked when the settings were made
    }
  }
  return out;
}

/**
 * Resolve `req.ref` on the first endpoint that answers, check its digest, and copy it into
 * `dest` (skopeo's `dir:` layout) unless `cached(digest)` says it is there already.
 * @throws ImageError the one endpoint's error; with several endpoints, the last one's code and a
 *   message naming each endpoint and its failure (and that a mirror-only registry was not tried);
 *   `image.digest_mismatch` at once when an endpoint serves another manifest than a pinned digest
 */
export async function fetchImage(req: FetchRequest, dest: string, cached: (digest: string) => boolean): Promise<Fetched> {
  const ref = formatImageRef(req.ref);
  const endpoints = endpointsFor(req.ref, req.registries);
  const ctx = pullContext(req, endpoints);
  const failures: { label: string; code: string; message: string }[] = [];
  let last: unknown;
  for (const [i, e] of endpoints.entries()) {
    try {
      req.progress(`resolving ${ref}${e.mirror ? ` on ${e.label}` : ""}`);
      const manifest = await inspectManifest(e, req.ref, ref, ctx);
      if (req.ref.digest && manifest.digest !== req.ref.digest) throw digestMismatch(ref, e, req.ref.digest, manifest.digest);
      if (cached(manifest.digest)) return { endpoint: e, manifest, copied: false };
      req.progress(`pulling ${ref}${e.mirror ? ` from ${e.label}` : ""} (${(manifest.compressedBytes / 1048576).toFixed(1)} MiB compressed)`);
      await copyImage(e, manifest.digest, dest, ref, ctx, req.progress);
      log.info({ ref, digest: manifest.digest, endpoint: e.label }, "image fetched");
      return { endpoint: e, manifest, copied: true };
    } catch (err) {
      last = err;
      const code = errorCode(err) ?? "image.pull_failed";
      const message = redact(errorMessage(err), ctx.secrets);
      failures.push({ label: e.label, code, message });
      if (!FALL_THROUGH.has(code) || req.signal?.aborted) throw err;
      const next = endpoints[i + 1];
      if (next) {
        log.warn({ ref, endpoint: e.label, code, err: message, next: next.label }, "registry endpoint failed, trying the next");
        req.progress(`${e.label} failed (${code}): ${message}; trying ${next.label}`);
      }
    }
  }
  const skipped = req.registries.mirrorOnly.includes(req.ref.registry) ? `; registry ${req.ref.registry} itself not tried ([image] mirror_only)` : "";
  if (failures.length === 1 && !skipped) throw last;
  const code = (failures[failures.length - 1]?.code ?? "image.pull_failed") as ImageErrorCode;
  throw new ImageError(code, `pulling ${ref} failed on every endpoint: ${failures.map((f) => `${f.label}: ${f.message}`).join("; ")}${skipped}`, {
    ref,
    endpoints: failures.map(({ label, code }) => ({ endpoint: label, code })),
  });
}
