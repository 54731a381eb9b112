/**
 * Ingress fields of a create's `network` (E2B `SandboxNetworkConfig`, ../shared/docs/e2b-egress-secrets.md §3):
 * `maskRequestHost` (the Host the node's proxy sends into the sandbox, `${PORT}` replaced by the
 * port) and `httpsPorts` (guest ports that serve TLS; the proxy speaks TLS to them without
 * verifying the guest's certificate). Validated here with the rest of the network object;
 * applied by src/api/proxy.ts.
 */
import { NetError } from "./errors.ts";

const PORT_MARK = "${PORT}";
const HOST_PORT = /^(?=.{1,253}(:[0-9]{1,5})?$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*(:[0-9]{1,5})?$/;
/** envd's port: E2B refuses it in httpsPorts. */
const ENVD_PORT = 49983;
const MAX_HTTPS_PORTS = 128;

function bad(field: string, why: string): NetError {
  return new NetError("net.bad_policy", `network.${field}: ${why}`, { field: `network.${field}` });
}

/**
 * Check `maskRequestHost`: `host[:port]` in ASCII, where `${PORT}` may stand for (part of) a label
 * or the port. @throws NetError `net.bad_policy`
 */
export function checkMaskRequestHost(v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw bad("maskRequestHost", "must be a string");
  if (!/^[\x21-\x7e]+$/.test(v)) throw bad("maskRequestHost", "must be ASCII host[:port] without spaces");
  const probe = v.replaceAll(PORT_MARK, "8080");
  const port = /:([0-9]{1,5})$/.exec(probe);
  if (!HOST_PORT.test(probe) || (port && (Number(port[1]) < 1 || Number(port[1]) > 65535))) throw bad("maskRequestHost", "is not a valid host[:port] (${PORT} stands for the port)");
  return v;
}

/** The Host header for a request to `port` under mask `mask`. */
export function maskedHost(mask: string, port: number): string {
  return mask.replaceAll(PORT_MARK, String(port));
}

/** Check `httpsPorts`: at most 128 unique ports 1..65535, not envd's. @throws NetError `net.bad_policy` */
export function checkHttpsPorts(v: unknown): number[] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw bad("httpsPorts", "must be an array of ports");
  if (v.length > MAX_HTTPS_PORTS) throw bad("httpsPorts", `at most ${MAX_HTTPS_PORTS} entries`);
  const seen = new Set<number>();
  v.forEach((p, i) => {
    if (typeof p !== "number" || !Number.isInteger(p) || p < 1 || p > 65535) throw bad(`httpsPorts[${i}]`, "must be a port 1..65535");
    if (p === ENVD_PORT) throw bad(`httpsPorts[${i}]`, `envd's port ${ENVD_PORT} cannot be an HTTPS port`);
    if (seen.has(p)) throw bad(`httpsPorts[${i}]`, `port ${p} is listed twice`);
    seen.add(p);
  });
  return [...seen];
}
