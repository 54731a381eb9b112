/**
 * The server name (SNI) of a TLS ClientHello, read from the first bytes a guest sends, without
 * terminating anything: the egress interceptor decides from it whether a connection is for a host
 * with rules (terminated) or not (passed through untouched). Layout: RFC 8446 §4.1.2 and §5.1
 * (records), RFC 6066 §3 (server_name); a ClientHello may span several handshake records.
 */

/** Largest ClientHello looked at, bytes; bigger ones are taken as carrying no usable name. */
export const MAX_HELLO_BYTES = 65_536;

/** What the bytes so far say. */
export type HelloResult = { kind: "more" } | { kind: "hello"; serverName: string | null } | { kind: "not_tls" };

const HANDSHAKE = 22;
const CLIENT_HELLO = 1;
const SERVER_NAME_EXT = 0;
const HOST_NAME = 0;

/**
 * Parse the start of a client's byte stream.
 * @returns `more` while the ClientHello is incomplete, `hello` with its server name (null when it
 *   has none or is malformed past the point of being TLS), or `not_tls`.
 */
export function parseClientHello(data: Uint8Array): HelloResult {
  if (data.length === 0) return { kind: "more" };
  if (data[0] !== HANDSHAKE) return { kind: "not_tls" };
  if (data.length >= 2 && data[1] !== 3) return { kind: "not_tls" };
  // gather handshake bytes from consecutive records
  const hs: number[] = [];
  let off = 0;
  let need = -1;
  while (off + 5 <= data.length) {
    if (data[off] !== HANDSHAKE) return { kind: "hello", serverName: null };
    const len = (data[off + 3]! << 8) | data[off + 4]!;
    if (off + 5 + len > data.length) break;
    for (let i = 0; i < len; i++) hs.push(data[off + 5 + i]!);
    off += 5 + len;
    if (hs.length >= 4 && need < 0) {
      if (hs[0] !== CLIENT_HELLO) return { kind: "not_tls" };
      need = 4 + ((hs[1]! << 16) | (hs[2]! << 8) | hs[3]!);
      if (need > MAX_HELLO_BYTES) return { kind: "hello", serverName: null };
    }
    if (need >= 0 && hs.length >= need) return { kind: "hello", serverName: serverName(Uint8Array.from(hs.slice(4, need))) };
  }
  if (data.length > MAX_HELLO_BYTES + 5) return { kind: "hello", serverName: null };
  return { kind: "more" };
}

/** The host_name of a ClientHello body's server_name extension, or null. */
function serverName(b: Uint8Array): string | null {
  let o = 2 + 32; // legacy_version, random
  if (o + 1 > b.length) return null;
  o += 1 + b[o]!; // session id
  if (o + 2 > b.length) return null;
  o += 2 + ((b[o]! << 8) | b[o + 1]!); // cipher suites
  if (o + 1 > b.length) return null;
  o += 1 + b[o]!; // compression methods
  if (o + 2 > b.length) return null;
  const end = Math.min(b.length, o + 2 + ((b[o]! << 8) | b[o + 1]!));
  o += 2;
  while (o + 4 <= end) {
    const type = (b[o]! << 8) | b[o + 1]!;
    const len = (b[o + 2]! << 8) | b[o + 3]!;
    o += 4;
    if (o + len > end) return null;
    if (type === SERVER_NAME_EXT) {
      let p = o + 2;
      const listEnd = Math.min(o + len, o + 2 + ((b[o]! << 8) | b[o + 1]!));
      while (p + 3 <= listEnd) {
        const nameType = b[p]!;
        const nameLen = (b[p + 1]! << 8) | b[p + 2]!;
        p += 3;
        if (p + nameLen > listEnd) return null;
        if (nameType === HOST_NAME) {
          const name = new TextDecoder().decode(b.subarray(p, p + nameLen));
          return /^[A-Za-z0-9._-]{1,253}$/.test(name) ? name.toLowerCase() : null;
        }
        p += nameLen;
      }
      return null;
    }
    o += len;
  }
  return null;
}
