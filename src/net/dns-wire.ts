/**
 * The few parts of the DNS message format (RFC 1035 §4.1) the egress DNS proxy needs: the
 * header id, the first question, and A records of the answer section, with name compression
 * (§4.1.4). All offsets are bytes from the start of the message.
 */
import { NetError } from "./errors.ts";

/** Header layout (RFC 1035 §4.1.1): id, flags, qdcount, ancount, nscount, arcount; 2 bytes each. */
export const HDR_ID = 0;
export const HDR_FLAGS = 2;
export const HDR_QDCOUNT = 4;
export const HDR_ANCOUNT = 6;
export const HDR_NSCOUNT = 8;
export const HDR_ARCOUNT = 10;
export const HDR_SIZE = 12;
/** QTYPE/TYPE A and CLASS IN. */
export const TYPE_A = 1;
export const TYPE_CNAME = 5;
export const CLASS_IN = 1;
/** Maximum name length on the wire (RFC 1035 §2.3.4) and a bound on compression hops. */
const MAX_NAME = 255;
const MAX_HOPS = 64;

function malformed(why: string, offset: number): NetError {
  return new NetError("net.bad_dns", `malformed DNS message: ${why} at byte ${offset}`, { offset });
}

/** Read a (possibly compressed) name at `off`; returns the dotted name and the offset after it. */
export function readName(msg: Uint8Array, off: number): { name: string; next: number } {
  const labels: string[] = [];
  let pos = off;
  let next = -1;
  let len = 0;
  for (let hops = 0; hops <= MAX_HOPS; hops++) {
    if (pos >= msg.length) throw malformed("name runs past the end", pos);
    const b = msg[pos]!;
    if ((b & 0xc0) === 0xc0) {
      if (pos + 1 >= msg.length) throw malformed("truncated pointer", pos);
      if (next < 0) next = pos + 2;
      const target = ((b & 0x3f) << 8) | msg[pos + 1]!;
      // a pointer names an earlier occurrence (RFC 1035 §4.1.4): never itself, later bytes or past the end
      if (target >= pos) throw malformed("compression pointer does not point backwards", pos);
      pos = target;
      continue;
    }
    if ((b & 0xc0) !== 0) throw malformed("reserved label type", pos);
    if (b === 0) return { name: labels.join("."), next: next < 0 ? pos + 1 : next };
    if (pos + 1 + b > msg.length) throw malformed("label runs past the end", pos);
    len += b + 1;
    if (len > MAX_NAME) throw malformed("name longer than 255 bytes", pos);
    labels.push(new TextDecoder().decode(msg.subarray(pos + 1, pos + 1 + b)));
    pos += 1 + b;
  }
  throw malformed("too many compression pointers", off);
}

/** Encode a dotted name without compression. */
export function writeName(name: string): Uint8Array {
  const parts = name.replace(/\.$/, "").split(".").filter((l) => l.length > 0);
  const out: number[] = [];
  for (const p of parts) {
    const bytes = new TextEncoder().encode(p);
    if (bytes.length > 63) throw new NetError("net.bad_dns", `label ${p} longer than 63 bytes`, { name });
    out.push(bytes.length, ...bytes);
  }
  out.push(0);
  return Uint8Array.from(out);
}

/** Parsed view of a message: its id, first question and the A records of the answer section. */
export interface DnsMessage {
  id: number;
  flags: number;
  qname: string | null;
  qtype: number | null;
  /** A records of the answer section: address and TTL in seconds. */
  answersA: { name: string; ip: string; ttl: number }[];
}

/**
 * Parse `msg`.
 * @throws NetError `net.bad_dns` with the byte offset of the fault.
 */
export function parseMessage(msg: Uint8Array): DnsMessage {
  if (msg.length < HDR_SIZE) throw malformed("shorter than the 12-byte header", 0);
  const dv = new DataView(msg.buffer, msg.byteOffset, msg.byteLength);
  const id = dv.getUint16(HDR_ID);
  const flags = dv.getUint16(HDR_FLAGS);
  const qd = dv.getUint16(HDR_QDCOUNT);
  const an = dv.getUint16(HDR_ANCOUNT);
  let off = HDR_SIZE;
  let qname: string | null = null;
  let qtype: number | null = null;
  for (let i = 0; i < qd; i++) {
    const n = readName(msg, off);
    if (n.next + 4 > msg.length) throw malformed("truncated question", n.next);
    if (i === 0) {
      qname = n.name;
      qtype = dv.getUint16(n.next);
    }
    off = n.next + 4;
  }
  const answersA: DnsMessage["answersA"] = [];
  for (let i = 0; i < an; i++) {
    const n = readName(msg, off);
    if (n.next + 10 > msg.length) throw malformed("truncated resource record", n.next);
    const type = dv.getUint16(n.next);
    const cls = dv.getUint16(n.next + 2);
    const ttl = dv.getUint32(n.next + 4);
    const rdlen = dv.getUint16(n.next + 8);
    const rd = n.next + 10;
    if (rd + rdlen > msg.length) throw malformed("rdata runs past the end", rd);
    if (type === TYPE_A && cls === CLASS_IN && rdlen === 4) {
      answersA.push({ name: n.name, ip: `${msg[rd]}.${msg[rd + 1]}.${msg[rd + 2]}.${msg[rd + 3]}`, ttl });
    }
    off = rd + rdlen;
  }
  return { id, flags, qname, qtype, answersA };
}

/** Build a standard recursive query for `name` (type A by default). */
export function buildQuery(id: number, name: string, qtype = TYPE_A): Uint8Array {
  const q = writeName(name);
  const out = new Uint8Array(HDR_SIZE + q.length + 4);
  const dv = new DataView(out.buffer);
  dv.setUint16(HDR_ID, id);
  dv.setUint16(HDR_FLAGS, 0x0100); // RD
  dv.setUint16(HDR_QDCOUNT, 1);
  out.set(q, HDR_SIZE);
  dv.setUint16(HDR_SIZE + q.length, qtype);
  dv.setUint16(HDR_SIZE + q.length + 2, CLASS_IN);
  return out;
}

/**
 * Build a response to `query` carrying A records for its first question (no compression).
 * `rcode` 0 = NOERROR, 2 = SERVFAIL, 3 = NXDOMAIN.
 */
export function buildResponse(query: Uint8Array, addrs: { ip: string; ttl: number }[], rcode = 0): Uint8Array {
  const q = parseMessage(query);
  const name = writeName(q.qname ?? "");
  const rr = addrs.map(({ ip, ttl }) => {
    const b = new Uint8Array(name.length + 14);
    const dv = new DataView(b.buffer);
    b.set(name, 0);
    dv.setUint16(name.length, TYPE_A);
    dv.setUint16(name.length + 2, CLASS_IN);
    dv.setUint32(name.length + 4, ttl);
    dv.setUint16(name.length + 8, 4);
    ip.split(".").forEach((o, i) => (b[name.length + 10 + i] = Number(o)));
    return b;
  });
  const question = new Uint8Array(name.length + 4);
  question.set(name, 0);
  new DataView(question.buffer).setUint16(name.length, q.qtype ?? TYPE_A);
  new DataView(question.buffer).setUint16(name.length + 2, CLASS_IN);
  const total = HDR_SIZE + question.length + rr.reduce((s, r) => s + r.length, 0);
  const out = new Uint8Array(total);
  const dv = new DataView(out.buffer);
  dv.setUint16(HDR_ID, q.id);
  dv.setUint16(HDR_FLAGS, 0x8180 | (rcode & 0xf)); // QR, RD, RA
  dv.setUint16(HDR_QDCOUNT, 1);
  dv.setUint16(HDR_ANCOUNT, rr.length);
  out.set(question, HDR_SIZE);
  let off = HDR_SIZE + question.length;
  for (const r of rr) {
    out.set(r, off);
    off += r.length;
  }
  return out;
}

/** Copy of `msg` with the header id replaced. */
export function withId(msg: Uint8Array, id: number): Uint8Array {
  const out = Uint8Array.from(msg);
  new DataView(out.buffer).setUint16(HDR_ID, id);
  return out;
}
