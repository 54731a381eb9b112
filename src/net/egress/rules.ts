/**
 * `network.rules` (E2B SDK 2.51, ../shared/docs/e2b-egress-secrets.md §2, §4): per-host header
 * transforms for outbound HTTPS. Keys are exact DNS names or one leading `*.` (any depth of
 * subdomain, never the apex; a bare `*` is refused), lower-cased; an exact key beats every
 * wildcard, then the longest wildcard suffix wins, and the matching rule is used alone. Each rule
 * is `{transform: {headers: {Name: "value"}}}`; a value may hold `${e2b.secrets.NAME}`
 * placeholders, resolved on the node for each request (never in the sandbox). Limits are E2B's.
 * Parsing is strict: an unknown field is refused, and every error names the field at fault.
 */
import { NetError } from "../errors.ts";
import type { DomainPattern } from "../domain.ts";

/** Most rule domains per sandbox (`[network.egress] max_rule_domains` overrides it in the node). */
export const MAX_RULE_DOMAINS = 10;
const MAX_KEY = 128;
const MAX_HEADERS = 20;
const MAX_HEADER_NAME = 64;
const MAX_HEADER_VALUE = 2048;
const MAX_SECRETS_PER_DOMAIN = 32;
const SECRET_PREFIX = "${e2b.secrets.";
const IDENTITY_PREFIX = "${e2b.identity.tokens.";
/** RFC 9110 token. */
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** RFC 9110 field-value: visible ASCII/obs-text, SP and HTAB, no CR/LF/NUL. */
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const SECRET_NAME = /^[A-Za-z0-9_-]{1,128}$/;
const LABEL = /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/;

/**
 * A rule key: a DNS name (RFC 1123 labels, ≤ 253 bytes, last label not all digits: an IP address
 * is not a host name) or `*.` + one (`*.com` included), lower-cased; null when malformed.
 */
export function parseRuleDomain(text: string): DomainPattern | null {
  let s = text.trim().toLowerCase();
  if (s.endsWith(".")) s = s.slice(0, -1);
  const wildcard = s.startsWith("*.");
  if (wildcard) s = s.slice(2);
  if (s.length === 0 || s.length > 253) return null;
  const labels = s.split(".");
  if (!labels.every((l) => LABEL.test(l)) || /^[0-9]+$/.test(labels.at(-1)!)) return null;
  return { name: s, wildcard };
}

/** A piece of a header value: literal text or a secret's value. */
export type ValuePart = { text: string } | { secret: string };

/** One header a rule sets (replacing any of that name the request has). */
export interface HeaderTransform {
  name: string;
  parts: ValuePart[];
}

/** A validated rule: which hosts, and the headers it sets. */
export interface HostRule {
  pattern: DomainPattern;
  headers: HeaderTransform[];
}

function bad(field: string, why: string): NetError {
  return new NetError("net.bad_policy", `${field}: ${why}`, { field });
}

/**
 * Split a header value into literal text and secret placeholders. `${e2b.secrets.NAME}` ends at
 * the next `}`; its name is trimmed and lower-cased (as secret names are); other `${e2b.` text is
 * literal.
 * @throws NetError `net.bad_policy` for an unterminated or empty placeholder, a name that is not
 *   a secret name, and for `${e2b.identity.tokens.*}` (workload identity tokens: not supported)
 */
export function parsePlaceholders(value: string, field: string): ValuePart[] {
  const parts: ValuePart[] = [];
  let text = "";
  let i = 0;
  while (i < value.length) {
    if (value.startsWith(IDENTITY_PREFIX, i)) throw bad(field, "workload identity tokens (${e2b.identity.tokens.*}) are not supported by this node");
    if (!value.startsWith(SECRET_PREFIX, i)) {
      text += value[i++];
      continue;
    }
    const end = value.indexOf("}", i + SECRET_PREFIX.length);
    if (end < 0) throw bad(field, "malformed E2B placeholder: ${e2b.secrets. is not closed by }");
    const name = value.slice(i + SECRET_PREFIX.length, end).trim();
    if (!SECRET_NAME.test(name) || name.toLowerCase().startsWith("sec_")) throw bad(field, "malformed E2B placeholder: the secret name must be 1..128 of A-Z a-z 0-9 _ - (not an id)");
    if (text) parts.push({ text });
    text = "";
    parts.push({ secret: name.toLowerCase() });
    i = end + 1;
  }
  if (text) parts.push({ text });
  return parts;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

function onlyKeys(o: Record<string, unknown>, allowed: string[], field: string): void {
  for (const k of Object.keys(o)) if (!allowed.includes(k)) throw bad(`${field}.${k}`, `unknown field (accepted: ${allowed.join(", ")})`);
}

/**
 * Validate `network.rules` (an object of domain → rule list, or null/undefined for none).
 * @param maxDomains the most domains a sandbox may have rules for
 * @throws NetError `net.bad_policy` naming the field, e.g.
 *   `network.rules["*"]: not a domain name (example.com or *.example.com)`
 */
export function parseRules(json: unknown, maxDomains = MAX_RULE_DOMAINS): HostRule[] {
  if (json === undefined || json === null) return [];
  const root = "network.rules";
  if (!isObject(json)) throw bad(root, "must be an object of domain → rules");
  const entries = Object.entries(json);
  if (entries.length > maxDomains) throw bad(root, `at most ${maxDomains} domains`);
  const seen = new Set<string>();
  const out: HostRule[] = [];
  for (const [key, list] of entries) {
    const f = `${root}[${JSON.stringify(key.slice(0, MAX_KEY + 8))}]`;
    if (key.trim().length === 0) throw bad(f, "the domain must not be empty");
    if (key.length > MAX_KEY) throw bad(f, `the domain exceeds ${MAX_KEY} characters`);
    const pattern = parseRuleDomain(key);
    if (!pattern) throw bad(f, "not a domain name (example.com or *.example.com; a bare * is not allowed)");
    const canon = `${pattern.wildcard ? "*." : ""}${pattern.name}`;
    if (seen.has(canon)) throw bad(f, "domain keys must be unique ignoring case");
    seen.add(canon);
    if (!Array.isArray(list)) throw bad(f, "must be an array of rules");
    if (list.length > 1) throw bad(f, "at most 1 rule per domain");
    const headers: HeaderTransform[] = [];
    list.forEach((rule, i) => {
      const rf = `${f}[${i}]`;
      if (!isObject(rule)) throw bad(rf, "must be an object");
      onlyKeys(rule, ["transform"], rf);
      if (rule.transform === undefined || rule.transform === null) return;
      if (!isObject(rule.transform)) throw bad(`${rf}.transform`, "must be an object");
      onlyKeys(rule.transform, ["headers"], `${rf}.transform`);
      const hs = rule.transform.headers;
      if (hs === undefined || hs === null) return;
      if (!isObject(hs)) throw bad(`${rf}.transform.headers`, "must be an object of header name → value");
      const names = Object.entries(hs);
      if (names.length > MAX_HEADERS) throw bad(`${rf}.transform.headers`, `at most ${MAX_HEADERS} headers per rule`);
      const secrets = new Set<string>();
      for (const [name, value] of names) {
        const hf = `${rf}.transform.headers[${JSON.stringify(name.slice(0, MAX_HEADER_NAME + 8))}]`;
        if (!name) throw bad(hf, "the header name must not be empty");
        if (name.length > MAX_HEADER_NAME) throw bad(hf, `the header name exceeds ${MAX_HEADER_NAME} characters`);
        if (!TOKEN.test(name)) throw bad(hf, "the header name must be an HTTP token");
        if (typeof value !== "string") throw bad(hf, "the value must be a string");
        if (value.length > MAX_HEADER_VALUE) throw bad(hf, `the value exceeds ${MAX_HEADER_VALUE} characters`);
        if (!FIELD_VALUE.test(value)) throw bad(hf, "the value holds characters a header cannot carry (CR, LF, NUL, control)");
        const parts = parsePlaceholders(value, hf);
        for (const p of parts) if ("secret" in p) secrets.add(p.secret);
        headers.push({ name, parts });
      }
      if (secrets.size > MAX_SECRETS_PER_DOMAIN) throw bad(f, `references more than ${MAX_SECRETS_PER_DOMAIN} secrets`);
    });
    out.push({ pattern, headers });
  }
  return out;
}

/**
 * The rule for host `name` (a TLS server name or Host): an exact key first, else the wildcard
 * with the longest suffix; null when none matches.
 */
export function matchRule(rules: readonly HostRule[], name: string): HostRule | null {
  let host = name.toLowerCase();
  if (host.endsWith(".")) host = host.slice(0, -1);
  let best: HostRule | null = null;
  for (const r of rules) {
    if (!r.pattern.wildcard) {
      if (r.pattern.name === host) return r;
      continue;
    }
    if (host.endsWith(`.${r.pattern.name}`) && (!best || r.pattern.name.length > best.pattern.name.length)) best = r;
  }
  return best;
}

/** Every secret name the rules reference, with the field of its first use. */
export function referencedSecrets(rules: readonly HostRule[]): Map<string, string> {
  const out = new Map<string, string>();
  for (const r of rules) {
    for (const h of r.headers) {
      for (const p of h.parts) {
        if ("secret" in p && !out.has(p.secret)) out.set(p.secret, `network.rules[${JSON.stringify(`${r.pattern.wildcard ? "*." : ""}${r.pattern.name}`)}][0].transform.headers[${JSON.stringify(h.name)}]`);
      }
    }
  }
  return out;
}

/**
 * A header value as `getInfo` shows it: placeholders kept, every literal run masked as `***`
 * (a literal may be a credential the caller put there).
 */
export function maskHeaderValue(value: string): string {
  let parts: ValuePart[];
  try {
    parts = parsePlaceholders(value, "");
  } catch {
    return "***";
  }
  return parts.map((p) => ("secret" in p ? `\${e2b.secrets.${p.secret}}` : "***")).join("");
}
