/**
 * IPv4 addresses and CIDR blocks as unsigned 32-bit integers. Only dotted-quad notation with
 * decimal octets 0..255 (no leading zeros, RFC 6943 §3.1.1 "strict" form) is accepted, so an
 * entry like "010.1.1.1" or "1.2.3" is rejected instead of being read in some legacy radix.
 */

/** A CIDR block: `base` is the network address (host bits cleared), `prefix` 0..32. */
export interface Cidr {
  base: number;
  prefix: number;
}

const OCTET = /^(0|[1-9][0-9]{0,2})$/;

/** Parse "a.b.c.d"; returns null when malformed. */
export function parseIpv4(text: string): number | null {
  const parts = text.split(".");
  if (parts.length !== 4) return null;
  let v = 0;
  for (const p of parts) {
    if (!OCTET.test(p)) return null;
    const n = Number(p);
    if (n > 255) return null;
    v = v * 256 + n;
  }
  return v >>> 0;
}

/** Format a 32-bit unsigned integer as "a.b.c.d". */
export function formatIpv4(v: number): string {
  return [(v >>> 24) & 255, (v >>> 16) & 255, (v >>> 8) & 255, v & 255].join(".");
}

/** Netmask of a prefix length as an unsigned integer (0 for /0). */
export function maskOf(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}

/**
 * Parse "a.b.c.d/n" or a bare "a.b.c.d" (= /32). Host bits are cleared ("10.1.2.3/8" → 10.0.0.0/8).
 * Returns null when malformed.
 */
export function parseCidr(text: string): Cidr | null {
  const slash = text.indexOf("/");
  const ipText = slash < 0 ? text : text.slice(0, slash);
  const ip = parseIpv4(ipText);
  if (ip === null) return null;
  let prefix = 32;
  if (slash >= 0) {
    const p = text.slice(slash + 1);
    if (!/^(0|[1-9][0-9]?)$/.test(p)) return null;
    prefix = Number(p);
    if (prefix > 32) return null;
  }
  return { base: (ip & maskOf(prefix)) >>> 0, prefix };
}

/** "a.b.c.d/n" text of a block. */
export function formatCidr(c: Cidr): string {
  return `${formatIpv4(c.base)}/${c.prefix}`;
}

/** Number of addresses in a block (2^(32-prefix)). */
export function cidrSize(c: Cidr): number {
  return 2 ** (32 - c.prefix);
}

/** True when `ip` lies inside `c`. */
export function cidrContains(c: Cidr, ip: number): boolean {
  return ((ip & maskOf(c.prefix)) >>> 0) === c.base;
}

/** True when the two blocks share at least one address. */
export function cidrsOverlap(a: Cidr, b: Cidr): boolean {
  const p = Math.min(a.prefix, b.prefix);
  const m = maskOf(p);
  return ((a.base & m) >>> 0) === ((b.base & m) >>> 0);
}
