/**
 * The host's reader of envd's Connect streams (guest → host: untrusted bytes). Wire facts
 * (connectrpc.com/docs/protocol, "Streaming RPCs"; e2b-contract.md §4.1): a stream is a run of
 * envelopes, each a flags byte (0x02 = end of stream), a 4-byte big-endian length and that many
 * bytes of message (JSON here). The reader caps an envelope's length before it buffers a byte of
 * it, keeps a partial envelope as the chunks it came in (each byte copied at most once, when the
 * envelope is complete) and checks every message against the schema of its kind: anything else
 * is an OrchestratorError `orchestrator.envd_failed` saying what was wrong.
 */
import { Type as T, type Static } from "@sinclair/typebox";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { ChunkQueue } from "../util/chunk-queue.ts";
import { describeProblem, jsonSchema, type JsonSchema } from "../util/json-check.ts";

/** Envelope header: flags (1) + big-endian length (4). */
const HEADER_BYTES = 5;
/** Envelope flag of the end-of-stream message. */
export const CONNECT_END_STREAM = 0x02;

/**
 * Largest envelope accepted from envd, bytes. envd's data events carry at most 64 KiB of output
 * (`[envd] output_event_bytes` ≤ 65536), about 87 KiB as base64 JSON; 1 MiB leaves room for any
 * other message while a guest cannot make the host buffer more.
 */
export const MAX_CONNECT_FRAME_BYTES = 1 << 20;

/** Encode one Connect envelope (flags 0: 1 byte flags + big-endian length + JSON) holding `msg`. */
export function connectEnvelope(msg: unknown): Uint8Array {
  const body = new TextEncoder().encode(JSON.stringify(msg));
  const out = new Uint8Array(HEADER_BYTES + body.length);
  new DataView(out.buffer).setUint32(1, body.length);
  out.set(body, HEADER_BYTES);
  return out;
}

/** One envelope: its flags and its message, parsed as JSON. */
export interface ConnectFrame {
  flags: number;
  json: unknown;
}

function bad(why: string, details: Record<string, unknown>): OrchestratorError {
  return new OrchestratorError("orchestrator.envd_failed", `envd stream: ${why}`, { ...details, reason: why });
}

/**
 * Split a Connect stream into envelopes.
 * @param maxFrameBytes largest message accepted (bytes after the header)
 * @throws OrchestratorError `orchestrator.envd_failed` for an envelope longer than
 *   `maxFrameBytes` (before reading it), a message that is not UTF-8 JSON, or a stream that ends
 *   inside an envelope.
 */
export async function* connectFrames(stream: AsyncIterable<Uint8Array>, maxFrameBytes = MAX_CONNECT_FRAME_BYTES): AsyncGenerator<ConnectFrame> {
  const q = new ChunkQueue();
  const utf8 = new TextDecoder("utf-8", { fatal: true });
  let flags = -1;
  let len = 0;
  for await (const chunk of stream) {
    q.push(chunk);
    for (;;) {
      if (flags < 0) {
        if (q.length < HEADER_BYTES) break;
        const h = q.take(HEADER_BYTES);
        flags = h[0]!;
        len = new DataView(h.buffer, h.byteOffset, HEADER_BYTES).getUint32(1);
        if (len > maxFrameBytes) throw bad(`envelope of ${len} bytes exceeds the limit of ${maxFrameBytes}`, { length: len, max: maxFrameBytes });
      }
      if (q.length < len) break;
      const body = q.take(len);
      let json: unknown;
      try {
        json = JSON.parse(utf8.decode(body));
      } catch (e) {
        throw bad(`a message is not UTF-8 JSON (${e instanceof Error ? e.message : String(e)})`, { length: len });
      }
      const f = flags;
      flags = -1;
      yield { flags: f, json };
    }
  }
  if (flags >= 0 || q.length > 0) throw bad(`the stream ended inside an envelope (${q.length + (flags >= 0 ? HEADER_BYTES : 0)} bytes of it)`, { pending: q.length });
}

/** End-of-stream message: `{}` or `{error: {code, message}}`. */
const END_STREAM = jsonSchema(T.Object({ error: T.Optional(T.Object({ code: T.String(), message: T.Optional(T.String()) })) }));

/** envd process.Process Start/Connect message (`StartResponse`, proto3 JSON): one event. */
const PROCESS_EVENT = jsonSchema(
  T.Object({
    event: T.Optional(
      T.Object({
        start: T.Optional(T.Object({ pid: T.Optional(T.Integer({ minimum: 0 })) })),
        data: T.Optional(T.Object({ stdout: T.Optional(T.String()), stderr: T.Optional(T.String()), pty: T.Optional(T.String()) })),
        end: T.Optional(T.Object({ exitCode: T.Optional(T.Integer()), exited: T.Optional(T.Boolean()), status: T.Optional(T.String()), error: T.Optional(T.String()) })),
        keepalive: T.Optional(T.Object({})),
      }),
    ),
  }),
);

/** One checked message of a process stream. */
export type ProcessStreamMessage =
  | { end: true; error: { code: string; message: string } | null }
  | { end: false; event: NonNullable<Static<typeof PROCESS_EVENT.schema>["event"]> };

function checked<S extends JsonSchema<any>>(s: S, json: unknown, what: string): Static<S["schema"]> {
  const r = s.check(json);
  if (!r.ok) throw bad(`${what} ${describeProblem(r.problem)}`, { field: r.problem.path });
  return r.value;
}

/**
 * The messages of an envd process stream (Start or Connect), checked: events, then the end of
 * stream (with envd's error when it sent one). Stops after the end-of-stream message.
 * @throws OrchestratorError `orchestrator.envd_failed` as `connectFrames`, and for a message
 *   that is not a process event or end-of-stream message (the field named).
 */
export async function* processStream(stream: AsyncIterable<Uint8Array>, maxFrameBytes = MAX_CONNECT_FRAME_BYTES): AsyncGenerator<ProcessStreamMessage> {
  for await (const f of connectFrames(stream, maxFrameBytes)) {
    if (f.flags & CONNECT_END_STREAM) {
      const m = checked(END_STREAM, f.json, "end-of-stream message");
      yield { end: true, error: m.error ? { code: m.error.code, message: m.error.message ?? "" } : null };
      return;
    }
    yield { end: false, event: checked(PROCESS_EVENT, f.json, "process event").event ?? {} };
  }
}
