/**
 * Domain rules of egress policies and egress rules: "example.com" or "*.example.com", parsed,
 * matched against a DNS name, and written back as a user would write them.
 */

/** A domain rule: `exact` matches one name; `suffix` (from "*.example.com") matches strict subdomains. */
export interface DomainPattern {
  /** Lower-case name without trailing dot and without the "*." */
  name: string;
  wildcard: boolean;
}

const LABEL = /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/;

/**
 * Parse a domain rule: "example.com" or "*.example.com" (the wildcard only as the whole leftmost
 * label). Labels follow RFC 1123 (letters, digits, hyphen; 1..63 bytes; underscore tolerated),
 * at least two labels, total ≤ 253 bytes, last label not all digits (so "1.2.3.400" is a bad IP,
 * not a domain). Returns null when malformed.
 */
export function parseDomainPattern(text: string): DomainPattern | null {
  let s = text.trim().toLowerCase();
  if (s.endsWith(".")) s = s.slice(0, -1);
  let wildcard = false;
  if (s.startsWith("*.")) {
    wildcard = true;
    s = s.slice(2);
  }
  if (s.length === 0 || s.length > 253) return null;
  const labels = s.split(".");
  if (labels.length < 2) return null;
  if (!labels.every((l) => LABEL.test(l))) return null;
  if (/^[0-9]+$/.test(labels[labels.length - 1]!)) return null;
  return { name: s, wildcard };
}

/** True when DNS name `qname` (any case, optional trailing dot) is matched by `p`. */
export function domainMatches(p: DomainPattern, qname: string): boolean {
  let q = qname.toLowerCase();
  if (q.endsWith(".")) q = q.slice(0, -1);
  return p.wildcard ? q.endsWith("." + p.name) : q === p.name;
}

/** The text form of a pattern, as a user would write it. */
export function formatDomainPattern(p: DomainPattern): string {
  return p.wildcard ? `*.${p.name}` : p.name;
}
