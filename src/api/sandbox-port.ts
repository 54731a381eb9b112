/**
 * The sandbox port a request names, as the node's proxy (proxy.ts) and the gateway
 * (services/gateway/dataplane.ts) read it. Routing facts: e2b-dev/infra
 * packages/shared/pkg/proxy/host.go (via e2b-contract.md §1.3).
 */
import { ENVD_PORT } from "../envd/version.ts";

/** Headers naming the sandbox port (E2B's, ours, and upstream AgentENV's); they must agree. */
export const PORT_HEADERS = ["e2b-sandbox-port", "x-agentenv-sandbox-port", "x-agentenv-target-port"];

/** A port number 1..65535 written in decimal (at most 5 digits), or null. */
export function parsePort(s: string | null): number | null {
  if (s === null || !/^[0-9]{1,5}$/.test(s)) return null;
  const n = Number(s);
  return n >= 1 && n <= 65535 ? n : null;
}

/**
 * The sandbox port a header-routed request names: any of PORT_HEADERS, which must agree; none
 * means envd's port.
 * @returns the port, or `{ error }` describing a malformed or conflicting port header (a 400).
 */
export function headerPort(h: Headers): number | { error: string } {
  const named = PORT_HEADERS.map((n) => [n, h.get(n)] as const).filter(([, v]) => v !== null) as [string, string][];
  for (const [n, v] of named) {
    if (parsePort(v) === null) return { error: `invalid sandbox port ${JSON.stringify(v)} in header ${n}` };
  }
  const ports = new Set(named.map(([, v]) => parsePort(v)!));
  if (ports.size > 1) return { error: `conflicting sandbox ports (${named.map(([n, v]) => `${n}: ${v}`).join(", ")}): name one port` };
  return ports.size ? [...ports][0]! : ENVD_PORT;
}
