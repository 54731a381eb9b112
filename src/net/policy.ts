/**
 * Per-sandbox egress policy: the validated, plain-data form of the `network` object of
 * `POST /sandboxes` (`allowOut`, `denyOut`, `allow_internet_access`) and of the body of
 * `PUT /sandboxes/{id}/network` (`SandboxNetworkUpdateConfig` in the upstream openapi.yml:
 * allowOut = CIDR | IP | domain pattern, denyOut = CIDR | IP; allow wins over deny; an omitted
 * field clears it; `allow_internet_access: false` ≡ denyOut 0.0.0.0/0).
 *
 * Evaluation order inside a slot (see rules.ts): allowOut CIDRs → addresses learned from DNS
 * answers for allowOut domains → always-denied ranges (config) → denyOut → internet access /
 * default action. The first match decides, so an allow entry beats every deny entry.
 */
import { NetError } from "./errors.ts";
import { parseEgressProxy, type EgressProxy } from "./egress/proxy-config.ts";
import { parseRules, type HostRule } from "./egress/rules.ts";
import { checkHttpsPorts, checkMaskRequestHost } from "./ingress.ts";
import { type Cidr, formatCidr, parseCidr } from "./ipv4.ts";
import { formatDomainPattern, parseDomainPattern, type DomainPattern } from "./domain.ts";

/** A validated egress policy. CIDRs are normalised ("10.1.2.3/8" → 10.0.0.0/8). */
export interface EgressPolicy {
  allowCidrs: Cidr[];
  allowDomains: DomainPattern[];
  denyCidrs: Cidr[];
  /** false ≡ deny 0.0.0.0/0 (after allow rules). */
  allowInternetAccess: boolean;
  /** `network.rules`: header transforms of outbound HTTPS per host (grant no access). */
  rules: HostRule[];
  /** `network.egressProxy`: every TCP connection leaves through it; null: direct. */
  egressProxy: EgressProxy | null;
}

/** The policy of a sandbox created without any network fields. */
export function defaultPolicy(): EgressPolicy {
  return { allowCidrs: [], allowDomains: [], denyCidrs: [], allowInternetAccess: true, rules: [], egressProxy: null };
}

/** Hard bound on rule domains the parser takes (the node's `[network.egress] max_rule_domains` is checked by the manager). */
const RULE_DOMAINS_CAP = 1024;

function bad(field: string, index: number | null, entry: unknown, why: string): NetError {
  const where = index === null ? field : `${field}[${index}]`;
  return new NetError("net.bad_policy", `${where} ${JSON.stringify(entry)}: ${why}`, { field, index, entry });
}

function looksNumeric(s: string): boolean {
  return /^[0-9./]+$/.test(s);
}

function parseList(json: Record<string, unknown>, field: string): string[] {
  const v = json[field];
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw bad(field, null, v, "must be an array of strings");
  v.forEach((e, i) => {
    if (typeof e !== "string") throw bad(field, i, e, "must be a string");
  });
  return v as string[];
}

/** Upper bound on entries per list, so one request cannot build an unbounded chain. */
export const MAX_POLICY_ENTRIES = 1024;

/**
 * Validate untrusted JSON (the API body) into an `EgressPolicy`.
 * Accepts `allowOut`, `denyOut` (arrays of strings), `allow_internet_access` or
 * `allowInternetAccess` (boolean, default true), `rules` (egress/rules.ts) and `egressProxy`
 * (egress/proxy-config.ts); the ingress fields `allowPublicTraffic`, `maskRequestHost` and
 * `httpsPorts` are checked here too (ingress.ts) and left to the proxy. Other keys are ignored here
 * (a stored record of an older node may carry some): the API's strict bodies refuse them in requests.
 * @throws NetError `net.bad_policy` naming the field, index and entry at fault, e.g.
 *   `allowOut[2] "10.0.0.300": not a valid IPv4 address, CIDR or domain pattern`.
 */
export function parseEgressPolicy(json: unknown): EgressPolicy {
  if (json === undefined || json === null) return defaultPolicy();
  if (typeof json !== "object" || Array.isArray(json)) throw bad("network", null, json, "must be an object");
  const obj = json as Record<string, unknown>;
  if (obj.allowPublicTraffic !== undefined && obj.allowPublicTraffic !== null && typeof obj.allowPublicTraffic !== "boolean") throw bad("allowPublicTraffic", null, obj.allowPublicTraffic, "must be a boolean");
  checkMaskRequestHost(obj.maskRequestHost);
  checkHttpsPorts(obj.httpsPorts);
  const allow = parseList(obj, "allowOut");
  const deny = parseList(obj, "denyOut");
  for (const [field, list] of [["allowOut", allow], ["denyOut", deny]] as const) {
    if (list.length > MAX_POLICY_ENTRIES) throw bad(field, null, list.length, `more than ${MAX_POLICY_ENTRIES} entries`);
  }
  const policy = defaultPolicy();
  allow.forEach((entry, i) => {
    const s = entry.trim();
    if (s.includes(":")) throw bad("allowOut", i, entry, "IPv6 is not supported (sandboxes have IPv4 only)");
    const cidr = parseCidr(s);
    if (cidr) return void policy.allowCidrs.push(cidr);
    if (!looksNumeric(s)) {
      const d = parseDomainPattern(s);
      if (d) return void policy.allowDomains.push(d);
    }
    throw bad("allowOut", i, entry, "not a valid IPv4 address, CIDR or domain pattern (example.com, *.example.com)");
  });
  deny.forEach((entry, i) => {
    const s = entry.trim();
    if (s.includes(":")) throw bad("denyOut", i, entry, "IPv6 is not supported (sandboxes have IPv4 only)");
    const cidr = parseCidr(s);
    if (cidr) return void policy.denyCidrs.push(cidr);
    if (!looksNumeric(s) && parseDomainPattern(s)) throw bad("denyOut", i, entry, "domain names are not supported in denyOut");
    throw bad("denyOut", i, entry, "not a valid IPv4 address or CIDR");
  });
  const snake = obj.allow_internet_access;
  const camel = obj.allowInternetAccess;
  for (const [field, v] of [["allow_internet_access", snake], ["allowInternetAccess", camel]] as const) {
    if (v !== undefined && v !== null && typeof v !== "boolean") throw bad(field, null, v, "must be a boolean");
  }
  const flag = (snake ?? camel) as boolean | undefined | null;
  if (flag === false) policy.allowInternetAccess = false;
  policy.rules = parseRules(obj.rules, RULE_DOMAINS_CAP);
  policy.egressProxy = parseEgressProxy(obj.egressProxy);
  return policy;
}

/**
 * The egress policy of a create request (`NewSandbox`/`NewSandboxV2` body): `network.allowOut`,
 * `network.denyOut`, and the top-level `allow_internet_access` (false ≡ deny 0.0.0.0/0), which
 * also counts when given inside `network`.
 * @throws NetError `net.bad_policy` naming the entry, e.g. field "allowOut", index 2.
 */
export function parseCreateNetwork(body: unknown): EgressPolicy {
  if (body === undefined || body === null) return defaultPolicy();
  if (typeof body !== "object" || Array.isArray(body)) throw bad("body", null, body, "must be an object");
  const b = body as Record<string, unknown>;
  const net = b.network ?? {};
  if (typeof net !== "object" || net === null || Array.isArray(net)) throw bad("network", null, net, "must be an object");
  const top = b.allow_internet_access ?? b.allowInternetAccess;
  if (top !== undefined && top !== null && typeof top !== "boolean") throw bad("allow_internet_access", null, top, "must be a boolean");
  const policy = parseEgressPolicy(net);
  if (top === false) policy.allowInternetAccess = false;
  return policy;
}

/** JSON form stored in SQLite and returned by the API (`allowOut`/`denyOut` as strings). */
export function policyToJson(p: EgressPolicy): { allowOut: string[]; denyOut: string[]; allow_internet_access: boolean } {
  return {
    allowOut: [...p.allowCidrs.map(formatCidr), ...p.allowDomains.map(formatDomainPattern)],
    denyOut: p.denyCidrs.map(formatCidr),
    allow_internet_access: p.allowInternetAccess,
  };
}
