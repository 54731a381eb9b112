/**
 * Which requests are sandbox traffic (the data plane) and for which sandbox and port:
 * headers `e2b-sandbox-id` or `x-agentenv-sandbox-id`, with the port in `e2b-sandbox-port`,
 * `x-agentenv-sandbox-port` or upstream AgentENV's `x-agentenv-target-port` (they must agree,
 * as on the node: src/api/sandbox-port.ts), hosts
 * `{port}-{sandboxID}.{domain}` for the gateway's `sandbox_proxy_domains`, and the node's
 * `/proxy/{id}/{port}/...` prefix. Host rules (seeds, Distributed Control Plane): only the
 * configured domains, the sandbox id must be a DNS label character set (E2B ids: lowercase
 * letters and digits, never `-`, so the first `-` splits port from id), and the whole
 * `{port}-{sandboxID}` label must fit DNS's 63-character label limit.
 */
import { headerPort, parsePort } from "../../src/api/sandbox-port.ts";

/** A request's target inside a sandbox. */
export interface DataRoute {
  sandboxId: string;
  port: number;
  /** How it was addressed: the node is told by headers for `host` routes. */
  via: "header" | "host" | "path";
}

/** Longest DNS label (RFC 1035 §2.3.4). */
export const DNS_LABEL_MAX = 63;
const SANDBOX_ID = /^[a-z0-9]+$/;

/**
 * Parse the left-most label of `host` (port stripped) against `domains`.
 * @returns the route, or null when the host is not a sandbox host.
 */
export function hostRoute(host: string, domains: string[]): DataRoute | null {
  const h = host.replace(/:\d+$/, "").toLowerCase();
  for (const d of domains) {
    const suffix = "." + d.toLowerCase().replace(/^\.+/, "");
    if (!h.endsWith(suffix)) continue;
    const label = h.slice(0, -suffix.length);
    if (label.length === 0 || label.length > DNS_LABEL_MAX || label.includes(".")) continue;
    const dash = label.indexOf("-");
    if (dash < 1) continue;
    const port = parsePort(label.slice(0, dash));
    const id = label.slice(dash + 1);
    if (port === null || !SANDBOX_ID.test(id)) continue;
    return { sandboxId: id, port, via: "host" };
  }
  return null;
}

/**
 * Decide whether `req` is sandbox traffic.
 * @returns the route; null for the control plane; a string explaining a malformed routing
 *   header (answer 400).
 */
export function dataRoute(req: Request, url: URL, domains: string[]): DataRoute | string | null {
  const h = req.headers;
  const id = h.get("e2b-sandbox-id") ?? h.get("x-agentenv-sandbox-id");
  if (id !== null) {
    const port = headerPort(h);
    if (typeof port !== "number") return port.error;
    return { sandboxId: id, port, via: "header" };
  }
  const byHost = hostRoute(h.get("host") ?? url.host, domains);
  if (byHost) return byHost;
  const p = /^\/proxy\/([a-z0-9]+)\/([0-9]{1,5})(\/.*)?$/.exec(url.pathname);
  if (p) {
    const port = parsePort(p[2]!);
    if (port === null) return `invalid sandbox port ${p[2]}`;
    return { sandboxId: p[1]!, port, via: "path" };
  }
  return null;
}

/** Whether `id` can be a sandbox id at all (anything else is unknown without asking). */
export function plausibleSandboxId(id: string): boolean {
  return id.length <= 64 && SANDBOX_ID.test(id);
}
