/**
 * Connect-protocol server streaming written directly on fetch `Request`/`Response`, for the
 * streams that carry bulk data (process output). `@connectrpc/connect`'s router serialises and
 * writes every message on its own (JSON through a JS object, one body chunk per message); here
 * the stream's producer encodes a whole batch of messages as parts (envelope and field headers,
 * payload views, base64 text) that go straight into the response's sink (a Bun direct stream:
 * each write is copied into the connection's buffer, nothing is assembled or queued in between),
 * one flush per batch. A write the connection cannot take yet is awaited before the next batch
 * is asked for, so a slow client stops the producer (back-pressure) instead of growing buffers.
 *
 * Wire facts (connectrpc.com/docs/protocol, "Streaming RPCs"; e2b-contract.md §4.1): request
 * `POST` with `content-type: application/connect+json|+proto`, body = one envelope (flags byte,
 * 4-byte big-endian length, message); response 200 with the same content type, envelopes with
 * flags 0, then one end-stream envelope (flags 0x02) holding JSON `{}` or `{"error":{code,
 * message}}`. Errors after the headers, including a bad request message, travel in the
 * end-stream envelope; a wrong content type is 415, a wrong method 405 (as connect-es answers).
 */
import { fromBinary, fromJson, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { codeToString, parseTimeout } from "@connectrpc/connect/protocol-connect";
import { toConnectError } from "./errors.ts";
import { errorMessage } from "../util/error.ts";

/** Envelope flag: the message is compressed with the stream's `connect-content-encoding`. */
const FLAG_COMPRESSED = 0x01;
/** Envelope flag: end-of-stream message (JSON). */
const FLAG_END_STREAM = 0x02;
/** Bytes before an envelope's message: flags (1) + big-endian length (4). */
export const ENVELOPE_HEADER_BYTES = 5;

/** A parsed server-streaming call. */
export interface StreamCall<D extends DescMessage> {
  /** Binary protobuf (`+proto`) or JSON (`+json`) messages. */
  binary: boolean;
  message: MessageShape<D>;
  /** `connect-timeout-ms`, when sent. */
  timeoutMs: number | undefined;
  header: Headers;
}

/** Bytes or ASCII text written to the response in order; together one or more whole envelopes. */
export type StreamParts = (Uint8Array | string)[];

/** What a stream produces: batches of parts (each batch one or more whole envelopes) until null. */
export interface StreamBody {
  /**
   * The next batch: parts that together are one or more whole message envelopes (see
   * `writeEnvelopeHeader`), or null when the stream ends normally. Parts are not used after
   * they are written (views of buffers nobody changes are fine): `next` is called again only
   * once the previous batch is in the connection's buffers, so the producer may then free what
   * that batch referenced. Throwing ends the stream with that error. `signal` aborts when the
   * client goes away.
   */
  next(signal: AbortSignal): Promise<StreamParts | null>;
  /** Release what the stream holds; called once, on every path. */
  close(): void;
}

/** Limits of the request side. */
export interface StreamLimits {
  /** Largest request body (one envelope), bytes. */
  maxRequestBytes: number;
  /** Largest `connect-timeout-ms` accepted. */
  maxTimeoutMs: number;
}

/** Write the 5-byte envelope header for a message of `length` bytes at `offset`. */
export function writeEnvelopeHeader(buf: Uint8Array, offset: number, length: number, flags = 0): void {
  buf[offset] = flags;
  buf[offset + 1] = length >>> 24;
  buf[offset + 2] = (length >>> 16) & 0xff;
  buf[offset + 3] = (length >>> 8) & 0xff;
  buf[offset + 4] = length & 0xff;
}

/** One enveloped message. */
export function envelope(message: Uint8Array, flags = 0): Uint8Array {
  const out = new Uint8Array(ENVELOPE_HEADER_BYTES + message.byteLength);
  writeEnvelopeHeader(out, 0, message.byteLength, flags);
  out.set(message, ENVELOPE_HEADER_BYTES);
  return out;
}

/** The end-stream envelope: `{}` on success, else the error as Connect JSON. */
export function endStreamEnvelope(error?: ConnectError): Uint8Array {
  const body = error ? { error: { code: codeToString(error.code), message: error.rawMessage } } : {};
  return envelope(new TextEncoder().encode(JSON.stringify(body)), FLAG_END_STREAM);
}

async function readRequest<D extends DescMessage>(req: Request, schema: D, binary: boolean, limits: StreamLimits): Promise<MessageShape<D>> {
  const len = Number(req.headers.get("content-length") ?? "0");
  if (len > limits.maxRequestBytes) throw new ConnectError(`request of ${len} bytes exceeds ${limits.maxRequestBytes}`, Code.ResourceExhausted);
  const body = new Uint8Array(await req.arrayBuffer());
  if (body.byteLength > limits.maxRequestBytes) throw new ConnectError(`request of ${body.byteLength} bytes exceeds ${limits.maxRequestBytes}`, Code.ResourceExhausted);
  if (body.byteLength < ENVELOPE_HEADER_BYTES) throw new ConnectError("protocol error: request has no message envelope", Code.InvalidArgument);
  const flags = body[0]!;
  const size = new DataView(body.buffer, body.byteOffset).getUint32(1);
  if (ENVELOPE_HEADER_BYTES + size > body.byteLength) throw new ConnectError("protocol error: truncated request envelope", Code.InvalidArgument);
  let data = body.subarray(ENVELOPE_HEADER_BYTES, ENVELOPE_HEADER_BYTES + size);
  if (flags & FLAG_COMPRESSED) {
    const enc = (req.headers.get("connect-content-encoding") ?? "").toLowerCase();
    if (enc !== "gzip") throw new ConnectError(`protocol error: compressed message without a supported connect-content-encoding (${enc || "none"})`, Code.InvalidArgument);
    data = Bun.gunzipSync(data);
    if (data.byteLength > limits.maxRequestBytes) throw new ConnectError(`request of ${data.byteLength} bytes exceeds ${limits.maxRequestBytes}`, Code.ResourceExhausted);
  }
  try {
    if (binary) return fromBinary(schema, data);
    return fromJson(schema, JSON.parse(new TextDecoder().decode(data)), { ignoreUnknownFields: true });
  } catch (err) {
    throw new ConnectError(`cannot decode request: ${errorMessage(err)}`, Code.InvalidArgument);
  }
}

/**
 * Serve one server-streaming call: parse the request as `schema`, `open` the stream, and pull
 * body chunks from it as the client reads. Never throws: protocol errors are 415/405 responses,
 * anything else ends the stream with an error envelope.
 */
export async function serveServerStream<D extends DescMessage>(
  req: Request,
  schema: D,
  limits: StreamLimits,
  open: (call: StreamCall<D>) => Promise<StreamBody> | StreamBody,
): Promise<Response> {
  const ctype = (req.headers.get("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
  if (ctype !== "application/connect+json" && ctype !== "application/connect+proto") {
    return new Response(null, { status: 415, headers: { "Accept-Post": "application/connect+json, application/connect+proto" } });
  }
  if (req.method !== "POST") return new Response(null, { status: 405, headers: { Allow: "POST" } });
  const binary = ctype === "application/connect+proto";
  const headers = { "Content-Type": ctype };

  let body: StreamBody;
  try {
    const timeout = parseTimeout(req.headers.get("connect-timeout-ms"), limits.maxTimeoutMs);
    if (timeout.error) throw timeout.error;
    const message = await readRequest(req, schema, binary, limits);
    body = await open({ binary, message, timeoutMs: timeout.timeoutMs, header: req.headers });
  } catch (err) {
    return new Response(endStreamEnvelope(toConnectError(err)), { status: 200, headers });
  }

  const gone = new AbortController();
  let closed = false;
  const release = () => {
    if (closed) return;
    closed = true;
    body.close();
  };
  const onAbort = () => {
    gone.abort();
    release();
  };
  req.signal.addEventListener("abort", onAbort, { once: true });
  /** Write `parts`, waiting whenever the connection holds back, then send them. */
  const send = async (controller: ReadableStreamDirectController, parts: StreamParts): Promise<void> => {
    for (const part of parts) {
      let r = controller.write(part);
      if (r instanceof Promise) r = await r;
      // 0 for a non-empty part: the connection is gone
      if (r === 0 && (typeof part === "string" ? part.length : part.byteLength) > 0) throw new Error("client went away");
    }
    const f = controller.flush();
    if (f instanceof Promise) await f;
  };
  const stream = new ReadableStream({
    type: "direct",
    // A server response calls pull once: the whole stream is this loop.
    async pull(controller) {
      try {
        for (;;) {
          let parts: StreamParts | null;
          try {
            parts = await body.next(gone.signal);
          } catch (err) {
            if (gone.signal.aborted) return;
            release();
            await send(controller, [endStreamEnvelope(toConnectError(err))]);
            return;
          }
          if (gone.signal.aborted) return;
          if (!parts) break;
          await send(controller, parts);
          if (gone.signal.aborted) return;
        }
        release();
        req.signal.removeEventListener("abort", onAbort);
        await send(controller, [endStreamEnvelope()]);
      } catch (err) {
        // the connection failed under a write: the client is gone
        onAbort();
        void err;
      } finally {
        release();
        try {
          controller.close();
        } catch {
          /* already closed with the connection */
        }
      }
    },
    cancel() {
      onAbort();
    },
  });
  return new Response(stream, { status: 200, headers });
}
