/**
 * An OCI registry blob read lazily with HTTP range requests (overlaybd registryfs_v2,
 * overlaybd-format.md 5): probe with `Range: bytes=0-0`; on 401/403 follow the
 * `WWW-Authenticate` challenge (Bearer: fetch a token from the realm with optional Basic
 * credentials; Basic: send credentials); a 3xx on the blob is remembered as the "actual URL"
 * and later range reads go there without auth. Size comes from `Content-Range`.
 */
import { Type as T } from "@sinclair/typebox";
import { describeProblem, jsonSchema } from "../../util/json-check.ts";
import { readCapped } from "../../util/read-capped.ts";
import { rootCertificates } from "node:tls";
import type { Backend } from "./backend.ts";
import { fail } from "./errors.ts";
import { logger } from "../../observability/log.ts";
import { errorMessage } from "../../util/error.ts";

/** A token server's answer (Docker registry token authentication: `token` or `access_token`, `expires_in` seconds). */
const TOKEN_ANSWER = jsonSchema(T.Object({ token: T.Optional(T.String()), access_token: T.Optional(T.String()), expires_in: T.Optional(T.Number()) }));
/** Largest token server answer read, bytes (a token is a few KiB). */
const TOKEN_ANSWER_BYTES = 1 << 20;

const log = logger("overlaybd");

/** Options of a registry blob. Times in ms. */
export interface RegistryOptions {
  /** Credentials for the token realm (Bearer) or the registry itself (Basic). */
  username?: string;
  password?: string;
  /** Attempts per read (default 3). */
  retries?: number;
  /** Per-request timeout (default 30000). */
  timeoutMs?: number;
  /** Token lifetime when the token server states none (default 30000). */
  tokenTtlMs?: number;
  /** How long a redirect target is reused (default 300000). */
  actualUrlTtlMs?: number;
  /** OAuth2 refresh token (Docker's `identitytoken`) exchanged at a Bearer realm instead of Basic credentials. */
  identityToken?: string;
  /** Proxy of the requests (fetch's `proxy`: a URL, or false for none); default: Bun's reading of the environment. */
  proxy?: string | false;
  /** PEM CA certificates trusted for https:// (with the system's). */
  ca?: string[];
}

/** Request counters. */
export interface RegistryStats {
  requests: number;
  rangeReads: number;
  bytes: number;
  tokenFetches: number;
}

interface Challenge {
  scheme: "bearer" | "basic";
  params: Record<string, string>;
}

/** Parse a WWW-Authenticate header (`Bearer realm="..",service="..",scope=".."`). */
export function parseChallenge(h: string | null): Challenge | null {
  if (!h) return null;
  const m = /^\s*(\w+)\s*(.*)$/.exec(h);
  if (!m) return null;
  const scheme = m[1]!.toLowerCase();
  if (scheme !== "bearer" && scheme !== "basic") return null;
  const params: Record<string, string> = {};
  for (const p of m[2]!.matchAll(/(\w+)=(?:"([^"]*)"|([^,\s]*))/g)) params[p[1]!.toLowerCase()] = p[2] ?? p[3] ?? "";
  return { scheme, params };
}

/** A registry blob as a Backend. Create with `RegistryBlob.open`. */
export class RegistryBlob implements Backend {
  readonly name: string;
  size = 0;
  readonly stats: RegistryStats = { requests: 0, rangeReads: 0, bytes: 0, tokenFetches: 0 };
  private auth: string | null = null;
  private authExpires = 0;
  private actualUrl: string | null = null;
  private actualExpires = 0;
  private readonly retries: number;
  private readonly timeoutMs: number;
  private readonly tokenTtlMs: number;
  private readonly actualUrlTtlMs: number;

  private constructor(readonly url: string, private readonly opts: RegistryOptions) {
    this.name = url;
    this.retries = opts.retries ?? 3;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.tokenTtlMs = opts.tokenTtlMs ?? 30_000;
    this.actualUrlTtlMs = opts.actualUrlTtlMs ?? 300_000;
  }

  /**
   * Authenticate, resolve redirects and learn the blob size.
   * @param size expected size in bytes, checked against the server's when given
   * @throws OverlaybdError `registry_auth`, `registry_http`, `registry_size`
   */
  static async open(url: string, opts: RegistryOptions = {}, size?: number): Promise<RegistryBlob> {
    const b = new RegistryBlob(url, opts);
    await b.resolve();
    if (size !== undefined && size !== b.size) fail("registry_size", `blob is ${b.size} bytes, config says ${size}`, { file: url, size, actual: b.size });
    return b;
  }

  private async request(url: string, headers: Record<string, string>, init: { method?: string; body?: string } = {}): Promise<Response> {
    this.stats.requests++;
    try {
      return await fetch(url, {
        ...init,
        headers,
        redirect: "manual",
        signal: AbortSignal.timeout(this.timeoutMs),
        ...(this.opts.proxy !== undefined ? { proxy: this.opts.proxy } : {}),
        ...(this.opts.ca?.length ? { tls: { ca: [...rootCertificates, ...this.opts.ca] } } : {}),
      } as RequestInit);
    } catch (e) {
      fail("registry_http", `request to ${url} failed: ${errorMessage(e)}`, { file: this.url, url });
    }
  }

  private basic(): string | null {
    if (this.opts.username === undefined) return null;
    return "Basic " + Buffer.from(`${this.opts.username}:${this.opts.password ?? ""}`).toString("base64");
  }

  private async authenticate(ch: Challenge): Promise<void> {
    if (ch.scheme === "basic") {
      const b = this.basic();
      if (!b) fail("registry_auth", "registry wants Basic credentials and none were given", { file: this.url });
      this.auth = b;
      this.authExpires = Number.POSITIVE_INFINITY;
      return;
    }
    const realm = ch.params.realm;
    if (!realm) fail("registry_auth", "Bearer challenge without a realm", { file: this.url });
    const u = new URL(realm);
    if (ch.params.service) u.searchParams.set("service", ch.params.service);
    if (ch.params.scope) u.searchParams.set("scope", ch.params.scope);
    const headers: Record<string, string> = {};
    this.stats.tokenFetches++;
    let r: Response;
    if (this.opts.identityToken) {
      // OAuth2 refresh-token grant (distribution's token spec, what Docker does with identitytoken)
      const form = new URLSearchParams({ grant_type: "refresh_token", refresh_token: this.opts.identityToken, client_id: "agentenv" });
      if (ch.params.service) form.set("service", ch.params.service);
      if (ch.params.scope) form.set("scope", ch.params.scope);
      r = await this.request(realm, { "content-type": "application/x-www-form-urlencoded" }, { method: "POST", body: form.toString() });
    } else {
      const b = this.basic();
      if (b) headers.authorization = b;
      r = await this.request(u.toString(), headers);
    }
    if (r.status !== 200) fail("registry_auth", `token server ${u.origin} answered ${r.status}`, { file: this.url, status: r.status });
    const body = await readCapped(r.body, TOKEN_ANSWER_BYTES);
    const answer = body.truncated ? null : TOKEN_ANSWER.parse(new TextDecoder().decode(body.bytes));
    if (!answer?.ok) fail("registry_auth", `token server reply is not a token answer${answer ? ` (${describeProblem(answer.problem)})` : ` (over ${TOKEN_ANSWER_BYTES} bytes)`}`, { file: this.url });
    const j = answer.value;
    const tok = j.token ?? j.access_token;
    if (!tok) fail("registry_auth", "token server reply holds no token", { file: this.url });
    this.auth = `Bearer ${tok}`;
    this.authExpires = Date.now() + Math.max(this.tokenTtlMs, (j.expires_in ?? 0) * 1000 - 5000);
  }

  /** Probe (auth), follow a redirect once, learn the size from Content-Range. */
  private async resolve(): Promise<void> {
    let r = await this.request(this.url, { range: "bytes=0-0", ...(this.auth ? { authorization: this.auth } : {}) });
    if (r.status === 401 || r.status === 403) {
      await r.body?.cancel();
      const ch = parseChallenge(r.headers.get("www-authenticate"));
      if (!ch) fail("registry_auth", `registry answered ${r.status} without a usable challenge`, { file: this.url, status: r.status });
      await this.authenticate(ch);
      r = await this.request(this.url, { range: "bytes=0-0", authorization: this.auth! });
    }
    if (r.status >= 300 && r.status < 400) {
      await r.body?.cancel();
      const loc = r.headers.get("location");
      if (!loc) fail("registry_http", `redirect ${r.status} without Location`, { file: this.url });
      this.actualUrl = new URL(loc, this.url).toString();
      this.actualExpires = Date.now() + this.actualUrlTtlMs;
      r = await this.request(this.actualUrl, { range: "bytes=0-0" });
    } else {
      this.actualUrl = null;
    }
    if (r.status !== 206 && r.status !== 200) {
      await r.body?.cancel();
      fail("registry_http", `blob probe answered ${r.status}`, { file: this.url, status: r.status });
    }
    const cr = r.headers.get("content-range");
    const total = cr ? /\/(\d+)\s*$/.exec(cr)?.[1] : r.status === 200 ? r.headers.get("content-length") : null;
    await r.body?.cancel();
    if (!total) fail("registry_http", "blob probe reply has no Content-Range total", { file: this.url });
    this.size = Number(total);
  }

  private async rangeOnce(buf: Uint8Array, offset: number, end: number): Promise<void> {
    if (this.actualUrl ? Date.now() > this.actualExpires : this.auth !== null && Date.now() > this.authExpires) await this.resolve();
    const target = this.actualUrl ?? this.url;
    const headers: Record<string, string> = { range: `bytes=${offset}-${end - 1}` };
    if (!this.actualUrl && this.auth) headers.authorization = this.auth;
    this.stats.rangeReads++;
    const r = await this.request(target, headers);
    if (r.status !== 206 && r.status !== 200) {
      await r.body?.cancel();
      fail("registry_http", `range read ${offset}-${end - 1} answered ${r.status}`, { file: this.url, offset, status: r.status });
    }
    const body = new Uint8Array(await r.arrayBuffer());
    const data = r.status === 200 ? body.subarray(offset, end) : body;
    if (data.length !== end - offset) fail("registry_http", `range read ${offset}-${end - 1} returned ${data.length} bytes`, { file: this.url, offset });
    buf.set(data);
    this.stats.bytes += data.length;
  }

  /** Range-read with retries; a failure drops the cached redirect/auth so the next try redoes them. */
  async pread(buf: Uint8Array, offset: number): Promise<number> {
    const end = Math.min(offset + buf.length, this.size);
    if (offset >= end) return 0;
    let last: unknown;
    for (let attempt = 1; attempt <= this.retries; attempt++) {
      try {
        await this.rangeOnce(buf.subarray(0, end - offset), offset, end);
        return end - offset;
      } catch (e) {
        last = e;
        log.warn({ file: this.url, offset, attempt, err: errorMessage(e) }, "registry range read failed");
        this.actualUrl = null;
        this.auth = null;
        try {
          await this.resolve();
        } catch (e2) {
          last = e2;
        }
      }
    }
    throw last;
  }

  async close(): Promise<void> {}
}
