/**
 * `network.egressProxy` (E2B `SandboxEgressProxyConfig`, ../shared/docs/e2b-egress-secrets.md §5):
 * the user's proxy every TCP connection of the sandbox leaves through. `address` is E2B's
 * `host:port` (SOCKS5), or a URL naming the protocol: `socks5://host:port` or
 * `http://host:port` (HTTP CONNECT); credentials only in `username` / `password` (RFC 1929 sizes:
 * ≤ 255 bytes each; a password needs a username). The password is kept by the node and never
 * shown (`maskProxy`).
 */
import { NetError } from "../errors.ts";
import { parseIpv4 } from "../ipv4.ts";

/** A validated egress proxy. */
export interface EgressProxy {
  protocol: "socks5" | "http";
  /** Lower-case host name or IPv4 address. */
  host: string;
  port: number;
  username?: string;
  password?: string;
}

const HOST = /^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$/;
const FIELDS = ["address", "username", "password"];

function bad(field: string, why: string): NetError {
  return new NetError("net.bad_policy", `network.egressProxy${field ? `.${field}` : ""}: ${why}`, { field: `network.egressProxy${field ? `.${field}` : ""}` });
}

/**
 * Validate `network.egressProxy` (null/undefined: none).
 * @throws NetError `net.bad_policy` naming the field (the password is never quoted)
 */
export function parseEgressProxy(json: unknown): EgressProxy | null {
  if (json === undefined || json === null) return null;
  if (typeof json !== "object" || Array.isArray(json)) throw bad("", "must be an object {address, username?, password?}");
  const o = json as Record<string, unknown>;
  for (const k of Object.keys(o)) if (!FIELDS.includes(k)) throw bad(k, `unknown field (accepted: ${FIELDS.join(", ")})`);
  if (typeof o.address !== "string" || !o.address.trim()) throw bad("address", "required: host:port, socks5://host:port or http://host:port");
  let text = o.address.trim();
  let protocol: EgressProxy["protocol"] = "socks5";
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(text);
  if (scheme) {
    const s = scheme[1]!.toLowerCase();
    if (s === "http") protocol = "http";
    else if (s !== "socks5" && s !== "socks5h") throw bad("address", `unsupported scheme ${JSON.stringify(s)}: socks5:// or http://`);
    text = text.slice(scheme[0].length).replace(/\/$/, "");
  }
  if (text.includes("@")) throw bad("address", "credentials go in username and password, not in the address");
  const m = /^([^:/?#\s]+):([0-9]{1,5})$/.exec(text);
  if (!m) throw bad("address", "must be host:port (IPv4 address or DNS name, port 1..65535)");
  const host = m[1]!.toLowerCase();
  const port = Number(m[2]);
  if (port < 1 || port > 65535) throw bad("address", "the port must be 1..65535");
  const ip = parseIpv4(host);
  if (ip === null && (!HOST.test(host) || /^[0-9.]+$/.test(host))) throw bad("address", "the host is neither an IPv4 address nor a DNS name");
  if (ip === 0) throw bad("address", "the unspecified address 0.0.0.0 is not a proxy");
  const out: EgressProxy = { protocol, host, port };
  for (const k of ["username", "password"] as const) {
    const v = o[k];
    if (v === undefined || v === null) continue;
    if (typeof v !== "string") throw bad(k, "must be a string");
    if (v.length === 0 || Buffer.byteLength(v) > 255) throw bad(k, "must be 1..255 bytes");
    out[k] = v;
  }
  if (out.password !== undefined && out.username === undefined) throw bad("password", "a password needs a username");
  return out;
}

/** What `getInfo` shows of an egress proxy: its address and user, never the password. */
export function maskProxy(json: unknown): Record<string, unknown> | null {
  if (typeof json !== "object" || json === null || Array.isArray(json)) return null;
  const o = json as Record<string, unknown>;
  return { ...(typeof o.address === "string" ? { address: o.address } : {}), ...(typeof o.username === "string" ? { username: o.username } : {}) };
}
