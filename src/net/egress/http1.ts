/**
 * HTTP/1.1 request framing (RFC 9112) for the egress interceptor: it reads a terminated guest
 * connection request by request, so each request head can get the headers its host's rule sets
 * while bodies pass through unchanged (chunked bodies stay chunked: only their boundaries are
 * tracked). After a CONNECT or an Upgrade request the rest of the stream is raw. Responses are
 * never parsed: they are relayed as the upstream sends them.
 */

/** A parsed request head; header names keep their case and order. */
export interface RequestHead {
  method: string;
  target: string;
  version: string;
  headers: [string, string][];
}

/** What a chunk of the guest's stream carried, in order. */
export type Http1Event =
  | { kind: "head"; head: RequestHead }
  | { kind: "body"; bytes: Uint8Array }
  /** The end of the current request's body. */
  | { kind: "end" }
  /** Bytes after a CONNECT/Upgrade request: relay as they are. */
  | { kind: "raw"; bytes: Uint8Array }
  /** The stream is not HTTP/1.x as this reader accepts it (answer `status`, then close). */
  | { kind: "error"; status: number; message: string };

const CRLF2 = Buffer.from("\r\n\r\n");
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

type State =
  | { s: "head" }
  | { s: "fixed"; left: number }
  | { s: "chunk-size" }
  | { s: "chunk-data"; left: number }
  | { s: "chunk-crlf" }
  | { s: "trailers" }
  | { s: "raw" }
  | { s: "failed" };

/** Incremental request reader; `push` each chunk, act on the events in order. */
export class RequestReader {
  private buf: Buffer = Buffer.alloc(0);
  private st: State = { s: "head" };

  /** @param maxHeadBytes bound on one request head (beyond: a 431 error event) */
  constructor(private readonly maxHeadBytes = 65_536) {}

  /** Feed the next bytes of the stream. */
  push(chunk: Uint8Array): Http1Event[] {
    const out: Http1Event[] = [];
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : Buffer.from(chunk);
    for (;;) {
      const st = this.st;
      if (st.s === "failed") {
        this.buf = Buffer.alloc(0);
        return out;
      }
      if (st.s === "raw") {
        if (this.buf.length) out.push({ kind: "raw", bytes: this.buf });
        this.buf = Buffer.alloc(0);
        return out;
      }
      if (this.buf.length === 0) return out;
      if (st.s === "head") {
        const end = this.buf.indexOf(CRLF2);
        if (end < 0) {
          if (this.buf.length > this.maxHeadBytes) return this.fail(out, 431, `request head larger than ${this.maxHeadBytes} bytes`);
          return out;
        }
        if (end + 4 > this.maxHeadBytes) return this.fail(out, 431, `request head larger than ${this.maxHeadBytes} bytes`);
        const parsed = parseHead(this.buf.subarray(0, end).toString("latin1"));
        this.buf = this.buf.subarray(end + 4);
        if ("error" in parsed) return this.fail(out, 400, parsed.error);
        out.push({ kind: "head", head: parsed.head });
        const framing = bodyFraming(parsed.head);
        if ("error" in framing) return this.fail(out, 400, framing.error);
        if (framing.upgrade) {
          this.st = { s: "raw" };
          continue;
        }
        if (framing.chunked) this.st = { s: "chunk-size" };
        else if (framing.length > 0) this.st = { s: "fixed", left: framing.length };
        else {
          out.push({ kind: "end" });
          this.st = { s: "head" };
        }
        continue;
      }
      if (st.s === "fixed" || st.s === "chunk-data") {
        const n = Math.min(st.left, this.buf.length);
        out.push({ kind: "body", bytes: this.buf.subarray(0, n) });
        this.buf = this.buf.subarray(n);
        st.left -= n;
        if (st.left > 0) return out;
        if (st.s === "fixed") {
          out.push({ kind: "end" });
          this.st = { s: "head" };
        } else this.st = { s: "chunk-crlf" };
        continue;
      }
      if (st.s === "chunk-crlf") {
        if (this.buf.length < 2) return out;
        if (this.buf[0] !== 13 || this.buf[1] !== 10) return this.fail(out, 400, "chunk data not followed by CRLF");
        out.push({ kind: "body", bytes: this.buf.subarray(0, 2) });
        this.buf = this.buf.subarray(2);
        this.st = { s: "chunk-size" };
        continue;
      }
      // chunk-size and trailers: whole lines
      const nl = this.buf.indexOf("\r\n");
      if (nl < 0) {
        if (this.buf.length > 4096) return this.fail(out, 400, "chunk line too long");
        return out;
      }
      const line = this.buf.subarray(0, nl).toString("latin1");
      out.push({ kind: "body", bytes: this.buf.subarray(0, nl + 2) });
      this.buf = this.buf.subarray(nl + 2);
      if (st.s === "chunk-size") {
        const m = /^([0-9A-Fa-f]{1,15})(;.*)?$/.exec(line);
        if (!m) return this.fail(out, 400, "malformed chunk size");
        const size = parseInt(m[1]!, 16);
        this.st = size === 0 ? { s: "trailers" } : { s: "chunk-data", left: size };
        continue;
      }
      if (line === "") {
        out.push({ kind: "end" });
        this.st = { s: "head" };
      }
    }
  }

  private fail(out: Http1Event[], status: number, message: string): Http1Event[] {
    this.st = { s: "failed" };
    this.buf = Buffer.alloc(0);
    out.push({ kind: "error", status, message });
    return out;
  }
}

function parseHead(text: string): { head: RequestHead } | { error: string } {
  const lines = text.split("\r\n");
  const m = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+) (\S+) (HTTP\/1\.[01])$/.exec(lines[0] ?? "");
  if (!m) return { error: "malformed request line" };
  const headers: [string, string][] = [];
  for (const l of lines.slice(1)) {
    const i = l.indexOf(":");
    if (i <= 0) return { error: "malformed header line" };
    const name = l.slice(0, i);
    if (!TOKEN.test(name)) return { error: "malformed header name" };
    headers.push([name, l.slice(i + 1).trim()]);
  }
  return { head: { method: m[1]!, target: m[2]!, version: m[3]!, headers } };
}

/** Values of header `name` (any case). */
export function headerValues(head: RequestHead, name: string): string[] {
  const n = name.toLowerCase();
  return head.headers.filter(([k]) => k.toLowerCase() === n).map(([, v]) => v);
}

function bodyFraming(head: RequestHead): { chunked: boolean; length: number; upgrade: boolean } | { error: string } {
  const upgrade = head.method === "CONNECT" || (headerValues(head, "upgrade").length > 0 && headerValues(head, "connection").some((v) => /(^|,)\s*upgrade\s*(,|$)/i.test(v)));
  const te = headerValues(head, "transfer-encoding");
  const cl = headerValues(head, "content-length");
  if (te.length && cl.length) return { error: "both Transfer-Encoding and Content-Length" };
  if (te.length) {
    const codings = te.join(",").split(",").map((s) => s.trim().toLowerCase()).filter(Boolean);
    if (codings.at(-1) !== "chunked") return { error: "a request Transfer-Encoding must end with chunked" };
    return { chunked: true, length: 0, upgrade };
  }
  if (cl.length) {
    const vals = new Set(cl.join(",").split(",").map((s) => s.trim()));
    if (vals.size !== 1) return { error: "conflicting Content-Length values" };
    const v = [...vals][0]!;
    if (!/^[0-9]{1,15}$/.test(v)) return { error: "malformed Content-Length" };
    return { chunked: false, length: Number(v), upgrade };
  }
  return { chunked: false, length: 0, upgrade };
}

/**
 * The bytes of `head` with `set` applied: every header of a set name (any case) is dropped, then
 * the set headers are appended in order.
 */
export function serializeHead(head: RequestHead, set: readonly [string, string][] = []): Buffer {
  const names = new Set(set.map(([n]) => n.toLowerCase()));
  const kept = head.headers.filter(([n]) => !names.has(n.toLowerCase()));
  const lines = [`${head.method} ${head.target} ${head.version}`, ...[...kept, ...set].map(([n, v]) => `${n}: ${v}`)];
  return Buffer.from(`${lines.join("\r\n")}\r\n\r\n`, "latin1");
}
