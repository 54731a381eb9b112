/**
 * Which HTTP(S) proxy the node's own outbound requests use (registry pulls, the S3 snapshot
 * store, webhooks): one decision for every client. The proxy comes from `[image] proxy` /
 * `no_proxy` when set, else from the environment as curl and Go read it (`HTTPS_PROXY`,
 * `HTTP_PROXY`, `NO_PROXY`, upper case first, then lower case); loopback (localhost,
 * 127.0.0.0/8, ::1) is never proxied, nor the extra direct hosts the node adds (its sandbox
 * networks, the scheduler).
 *
 * Clients: `proxyFor(url)` for a `fetch` (`proxy: proxyFor(u, s) ?? false`); `proxyEnv(s)` for a
 * child process (skopeo reads these variables itself); `installProxyEnv(s)` once at node start
 * for what reads `process.env` by itself (Bun's fetch without a `proxy` option and Bun's S3
 * client, which has no proxy option: both honour these variables, NO_PROXY with hosts,
 * `.domain` suffixes, IPs, CIDRs, `host:port` and `*`).
 *
 * NO_PROXY entries, as Go's httpproxy reads them: `*` (everything direct), `host` (the host and
 * its subdomains), `.domain` (subdomains only), an IP, a CIDR (`10.0.0.0/8`), any of them with
 * `:port` to match one port only.
 */
import { isIP } from "node:net";

/** The proxy of the node's outbound requests. "" = none. */
export interface ProxySettings {
  /** Proxy URL for https:// destinations. */
  httpsProxy: string;
  /** Proxy URL for http:// destinations. */
  httpProxy: string;
  /** NO_PROXY entries (loopback included). */
  noProxy: string[];
}

/** Always reached directly (Docker and Go treat these as loopback). */
export const LOOPBACK_NO_PROXY = ["localhost", "127.0.0.0/8", "::1"];

const ENV_NAMES = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"] as const;

function fromEnv(env: Record<string, string | undefined>, name: string): string {
  return (env[name.toUpperCase()] || env[name.toLowerCase()] || "").trim();
}

const splitList = (s: string) => s.split(",").map((x) => x.trim()).filter(Boolean);

/**
 * The proxy settings of the node.
 * @param explicit `[image] proxy` and `no_proxy`: when `proxy` is set it is the proxy of both
 *   schemes and the environment is not read
 * @param env the environment (default `process.env`)
 * @param direct hosts, IPs or CIDRs always reached directly besides loopback
 * @throws Error when a proxy URL is not http(s)://host[:port] (the caller names its source)
 */
export function proxySettings(explicit: { proxy: string; noProxy: string[] }, env: Record<string, string | undefined> = process.env, direct: string[] = []): ProxySettings {
  const s: ProxySettings = explicit.proxy
    ? { httpsProxy: explicit.proxy, httpProxy: explicit.proxy, noProxy: [...explicit.noProxy] }
    : { httpsProxy: fromEnv(env, "https_proxy"), httpProxy: fromEnv(env, "http_proxy"), noProxy: splitList(fromEnv(env, "no_proxy")) };
  for (const u of [s.httpsProxy, s.httpProxy]) if (u) checkProxyUrl(u);
  for (const d of [...LOOPBACK_NO_PROXY, ...direct]) if (!s.noProxy.includes(d)) s.noProxy.push(d);
  return s;
}

/** @throws Error when `u` is not an http(s) URL of a host. */
function checkProxyUrl(u: string): void {
  let url: URL;
  try {
    url = new URL(u);
  } catch {
    throw new Error(`proxy ${JSON.stringify(redactUrl(u))} is not a URL (http://host:port)`);
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || !url.hostname) throw new Error(`proxy ${JSON.stringify(redactUrl(u))} must be http://host:port or https://host:port`);
}

/**
 * `u` with any password replaced by `***` (proxy and store URLs may carry credentials; logs must
 * not). The password runs to the last `@` of the authority, as URL parsers read it, so one with
 * an unencoded `@` is hidden whole.
 */
export function redactUrl(u: string): string {
  return u.replace(/^([a-z][a-z0-9+.-]*:\/\/[^:/?#@]*:)[^/?#]*@/i, "$1***@");
}

/** Host without brackets, and the port the URL reaches (scheme default when none). */
function hostPort(url: URL): { host: string; port: number } {
  const host = url.hostname.replace(/^\[|\]$/g, "").toLowerCase();
  const port = url.port ? Number(url.port) : url.protocol === "https:" ? 443 : 80;
  return { host, port };
}

/** Whether `host` (a name or IP, no brackets) is loopback. */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  return h === "localhost" || h.endsWith(".localhost") || h === "::1" || /^127(?:\.\d{1,3}){3}$/.test(h);
}

/** IPv4 or IPv6 address as a bigint and its bit width, or null. */
function ipBits(ip: string): { v: bigint; bits: number } | null {
  const kind = isIP(ip);
  if (kind === 4) return { v: ip.split(".").reduce((a, o) => (a << 8n) | BigInt(Number(o)), 0n), bits: 32 };
  if (kind !== 6) return null;
  let [head, tail] = ip.includes("::") ? ip.split("::") as [string, string] : [ip, ""];
  const h = head ? head.split(":") : [];
  const t = tail ? tail.split(":") : [];
  const groups = [...h, ...Array(8 - h.length - t.length).fill("0"), ...t];
  if (groups.length !== 8 || groups.some((g) => !/^[0-9a-f]{1,4}$/i.test(g))) return null;
  return { v: groups.reduce((a, g) => (a << 16n) | BigInt(parseInt(g, 16)), 0n), bits: 128 };
}

/** Whether one NO_PROXY entry covers `host`:`port`. */
function entryMatches(entry: string, host: string, port: number): boolean {
  let e = entry.trim().toLowerCase();
  if (!e) return false;
  if (e === "*") return true;
  // a port: "host:port", "[v6]:port"; a bare IPv6 address has colons but no port
  let ePort: number | null = null;
  const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(e);
  if (m && !isIP(e)) {
    e = m[1]!;
    ePort = Number(m[2]);
  }
  e = e.replace(/^\[|\]$/g, "");
  if (ePort !== null && ePort !== port) return false;
  const slash = e.indexOf("/");
  if (slash > 0) {
    const net = ipBits(e.slice(0, slash));
    const addr = ipBits(host);
    const len = Number(e.slice(slash + 1));
    if (!net || !addr || net.bits !== addr.bits || !Number.isInteger(len) || len < 0 || len > net.bits) return false;
    const shift = BigInt(net.bits - len);
    return net.v >> shift === addr.v >> shift;
  }
  if (isIP(e) || isIP(host)) {
    const a = ipBits(e);
    const b = ipBits(host);
    return a !== null && b !== null && a.bits === b.bits && a.v === b.v;
  }
  if (e.startsWith(".")) return host.endsWith(e);
  if (e.startsWith("*.")) return host.endsWith(e.slice(1));
  return host === e || host.endsWith(`.${e}`);
}

/**
 * The proxy URL a request to `url` goes through, or null to go directly: loopback and NO_PROXY
 * hosts go directly; https:// uses `httpsProxy`, http:// `httpProxy`.
 * @example fetch(u, { proxy: proxyFor(u, settings) ?? false })
 */
export function proxyFor(url: string | URL, s: ProxySettings): string | null {
  const u = typeof url === "string" ? new URL(url) : url;
  const proxy = u.protocol === "https:" ? s.httpsProxy : u.protocol === "http:" ? s.httpProxy : "";
  if (!proxy) return null;
  const { host, port } = hostPort(u);
  if (isLoopbackHost(host)) return null;
  return s.noProxy.some((e) => entryMatches(e, host, port)) ? null : proxy;
}

/**
 * The environment variables that give a child process (skopeo, curl) these settings, upper and
 * lower case: a variable without a proxy is "" (Go and curl read an empty one as unset), so the
 * node's own environment cannot bring another proxy back.
 */
export function proxyEnv(s: ProxySettings): Record<string, string> {
  const noProxy = s.noProxy.join(",");
  return {
    HTTPS_PROXY: s.httpsProxy,
    https_proxy: s.httpsProxy,
    HTTP_PROXY: s.httpProxy,
    http_proxy: s.httpProxy,
    NO_PROXY: noProxy,
    no_proxy: noProxy,
  };
}

/**
 * Put the settings into `process.env` (what Bun's fetch and S3 client read at each request, and
 * what child processes inherit). Call once at node start; a variable without a proxy is removed.
 * ALL_PROXY is removed too: it would proxy what these settings send directly.
 */
export function installProxyEnv(s: ProxySettings, env: Record<string, string | undefined> = process.env): void {
  for (const [k, v] of Object.entries(proxyEnv(s))) {
    if (v) env[k] = v;
    else delete env[k];
  }
  delete env.ALL_PROXY;
  delete env.all_proxy;
}

/** The names `installProxyEnv` sets (for tests and diagnostics). */
export const PROXY_ENV_NAMES: readonly string[] = ENV_NAMES;
