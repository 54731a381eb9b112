/**
 * A sandbox's stored `network` object as the API shows it (`getInfo`, `GET /sandboxes/{id}`):
 * rules with their header values masked (placeholders kept, literal text as `***`), an egress
 * proxy without its password. Never the values secrets resolve to: those never reach a record.
 */
import { maskProxy } from "./proxy-config.ts";
import { maskHeaderValue } from "./rules.ts";

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** `network` with rule header values masked and the egress proxy's password left out. */
export function maskNetwork(network: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...network };
  if (isObject(network.rules)) {
    out.rules = Object.fromEntries(
      Object.entries(network.rules).map(([domain, list]) => [
        domain,
        Array.isArray(list)
          ? list.map((rule) => {
              if (!isObject(rule) || !isObject(rule.transform) || !isObject(rule.transform.headers)) return rule;
              const headers = Object.fromEntries(Object.entries(rule.transform.headers).map(([n, v]) => [n, typeof v === "string" ? maskHeaderValue(v) : "***"]));
              return { ...rule, transform: { ...rule.transform, headers } };
            })
          : list,
      ]),
    );
  }
  if ("egressProxy" in network) out.egressProxy = maskProxy(network.egressProxy);
  return out;
}
