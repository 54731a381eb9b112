/**
 * Streaming multipart/form-data reader (RFC 7578 / RFC 2046 §5.1). Part bodies are handed to a
 * sink chunk by chunk as they arrive, so uploads are never held whole in memory: at most one
 * network chunk plus a delimiter's worth of bytes is buffered. Filenames are returned verbatim
 * (E2B's SDK puts full paths there).
 */
import { EnvdError } from "../errors.ts";

/** Headers of one part, already parsed from Content-Disposition / Content-Type. */
export interface PartInfo {
  name?: string;
  filename?: string;
  contentType?: string;
}

/** Receives one part's body; `end` is called once after the last chunk. */
export interface PartSink {
  write(chunk: Uint8Array): Promise<void>;
  end(): Promise<void>;
}

/**
 * The boundary of a `multipart/form-data; boundary=...` content type.
 * @throws EnvdError `invalid_argument` when it is missing or longer than 70 chars (RFC 2046).
 */
export function boundaryOf(contentType: string): string {
  const m = /boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType);
  const b = m?.[1] ?? m?.[2];
  if (!b || b.length > 70) throw new EnvdError("invalid_argument", "multipart boundary missing or invalid", { contentType });
  return b;
}

/**
 * Parse a Content-Disposition value's `name` and `filename` parameters (`filename*` is RFC 5987
 * percent-encoded UTF-8).
 * @throws EnvdError `invalid_argument` for a `filename*` that does not decode.
 */
export function parseDisposition(value: string): { name?: string; filename?: string } {
  const out: { name?: string; filename?: string } = {};
  const re = /;\s*([A-Za-z0-9_*-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;]*))/g;
  for (let m = re.exec(value); m; m = re.exec(value)) {
    const key = m[1]!.toLowerCase();
    const raw = m[2] !== undefined ? m[2].replace(/\\(.)/g, "$1") : m[3]!.trim();
    if (key === "name") out.name = raw;
    else if (key === "filename") out.filename = raw;
    else if (key === "filename*") {
      const ext = /^[^']*'[^']*'(.*)$/.exec(raw);
      try {
        out.filename = decodeURIComponent(ext ? ext[1]! : raw);
      } catch {
        throw new EnvdError("invalid_argument", `multipart filename* is not valid percent-encoded UTF-8: ${JSON.stringify(raw.slice(0, 200))}`, {});
      }
    }
  }
  return out;
}

function parseHeaders(block: string): PartInfo {
  const info: PartInfo = {};
  for (const line of block.split("\r\n")) {
    const i = line.indexOf(":");
    if (i <= 0) continue;
    const key = line.slice(0, i).trim().toLowerCase();
    const value = line.slice(i + 1).trim();
    if (key === "content-disposition") Object.assign(info, parseDisposition(value));
    else if (key === "content-type") info.contentType = value;
  }
  return info;
}

const enum St {
  Preamble,
  AfterDelimiter,
  Headers,
  Body,
  Done,
}

/**
 * Read every part of `body`, calling `onPart` for its headers and streaming its bytes into the
 * returned sink (`null` skips the part's body).
 * @param maxHeaderBytes bound on one part's header block.
 * @throws EnvdError `invalid_argument` for malformed or truncated input.
 */
export async function readMultipart(
  body: AsyncIterable<Uint8Array>,
  boundary: string,
  onPart: (info: PartInfo) => Promise<PartSink | null>,
  maxHeaderBytes = 16 * 1024,
): Promise<number> {
  const delim = Buffer.from(`\r\n--${boundary}`);
  // A leading CRLF lets the first delimiter (which has none) match like the others.
  let buf: Buffer = Buffer.from("\r\n");
  let state = St.Preamble;
  let sink: PartSink | null = null;
  let parts = 0;

  const step = async (final: boolean): Promise<void> => {
    for (;;) {
      if (state === St.Preamble) {
        const i = buf.indexOf(delim);
        if (i < 0) {
          buf = buf.subarray(Math.max(0, buf.length - delim.length + 1));
          return;
        }
        buf = buf.subarray(i + delim.length);
        state = St.AfterDelimiter;
      } else if (state === St.AfterDelimiter) {
        // transport padding (spaces/tabs) may follow the boundary
        let j = 0;
        while (j < buf.length && (buf[j] === 0x20 || buf[j] === 0x09)) j++;
        if (buf.length - j < 2) return;
        if (buf[j] === 0x2d && buf[j + 1] === 0x2d) {
          state = St.Done;
          return;
        }
        if (buf[j] !== 0x0d || buf[j + 1] !== 0x0a) throw new EnvdError("invalid_argument", "malformed multipart delimiter", {});
        buf = buf.subarray(j + 2);
        state = St.Headers;
      } else if (state === St.Headers) {
        const i = buf.indexOf("\r\n\r\n");
        if (i < 0) {
          if (buf.length > maxHeaderBytes) throw new EnvdError("invalid_argument", "multipart part headers too large", { maxHeaderBytes });
          return;
        }
        const info = parseHeaders(buf.subarray(0, i).toString("utf8"));
        buf = buf.subarray(i + 4);
        parts++;
        sink = await onPart(info);
        state = St.Body;
      } else if (state === St.Body) {
        const i = buf.indexOf(delim);
        if (i >= 0) {
          if (sink && i > 0) await sink.write(buf.subarray(0, i));
          if (sink) await sink.end();
          sink = null;
          buf = buf.subarray(i + delim.length);
          state = St.AfterDelimiter;
          continue;
        }
        // keep a tail that could be the start of the delimiter
        const keep = final ? 0 : delim.length - 1;
        if (buf.length > keep) {
          const out = buf.subarray(0, buf.length - keep);
          // no copy: `buf` is not touched again until the sink has finished with `out`
          if (sink) await sink.write(out);
          buf = buf.subarray(buf.length - keep);
        }
        return;
      } else {
        return;
      }
    }
  };

  for await (const chunk of body) {
    if ((state as St) === St.Done) continue; // epilogue
    buf = buf.length ? Buffer.concat([buf, chunk]) : Buffer.from(chunk);
    await step(false);
  }
  if ((state as St) !== St.Done) throw new EnvdError("invalid_argument", "multipart body ended before the closing boundary", { parts });
  return parts;
}
