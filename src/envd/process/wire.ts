/**
 * Encoding of process events as `StartResponse` / `ConnectResponse` messages (both are
 * `{event: ProcessEvent}` with the same field number), batched into one buffer of envelopes.
 * Data events, the bulk of a stream, are written directly: JSON as
 * `{"event":{"data":{"stdout":"<base64>"}}}` (proto3 JSON: bytes are standard base64 with
 * padding) and binary as nested length-delimited fields (process.proto: StartResponse.event = 1,
 * ProcessEvent.data = 2, DataEvent.stdout = 1 / stderr = 2 / pty = 3). The rare events go through
 * protobuf-es.
 */
import { create, toBinary, toJsonString, type MessageInitShape } from "@bufbuild/protobuf";
import { ENVELOPE_HEADER_BYTES, writeEnvelopeHeader } from "../connect-stream.ts";
import { StartResponseSchema, type ProcessEventSchema } from "../gen/process_pb.ts";
import type { ProcEvent } from "./handle.ts";

/** The protobuf-es shape of one event (used for everything but data events). */
export function toProto(ev: ProcEvent): MessageInitShape<typeof ProcessEventSchema> {
  switch (ev.kind) {
    case "start":
      return { event: { case: "start" as const, value: { pid: ev.pid } } };
    case "data":
      return { event: { case: "data", value: { output: { case: ev.stream as "stdout", value: ev.data } } } };
    case "end":
      return { event: { case: "end" as const, value: { ...ev.end } } };
    case "keepalive":
      return { event: { case: "keepalive" as const, value: {} } };
  }
}

const enc = new TextEncoder();
/** DataEvent oneof field tags (field << 3 | wire type 2). */
const DATA_TAG = { stdout: 0x0a, stderr: 0x12, pty: 0x1a } as const;
const TAG_EVENT = 0x0a; // StartResponse.event = 1
const TAG_DATA = 0x12; // ProcessEvent.data = 2

function varintSize(n: number): number {
  let s = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 128);
    s++;
  }
  return s;
}

function putVarint(buf: Uint8Array, off: number, n: number): number {
  while (n >= 0x80) {
    buf[off++] = (n & 0x7f) | 0x80;
    n = Math.floor(n / 128);
  }
  buf[off++] = n;
  return off;
}

/** One event prepared for a batch: its message size and how to write it. */
interface Piece {
  size: number;
  write(buf: Buffer, off: number): void;
}

function dataPiece(stream: "stdout" | "stderr" | "pty", data: Uint8Array, binary: boolean): Piece {
  if (!binary) {
    const b64 = Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64");
    const head = `{"event":{"data":{"${stream}":"`;
    const tail = `"}}}`;
    return {
      size: head.length + b64.length + tail.length,
      write(buf, off) {
        off += buf.write(head, off, "latin1");
        off += buf.write(b64, off, "latin1");
        buf.write(tail, off, "latin1");
      },
    };
  }
  const n = data.byteLength;
  const inner = 1 + varintSize(n) + n;
  const mid = 1 + varintSize(inner) + inner;
  return {
    size: 1 + varintSize(mid) + mid,
    write(buf, off) {
      buf[off++] = TAG_EVENT;
      off = putVarint(buf, off, mid);
      buf[off++] = TAG_DATA;
      off = putVarint(buf, off, inner);
      buf[off++] = DATA_TAG[stream];
      off = putVarint(buf, off, n);
      buf.set(data, off);
    },
  };
}

function otherPiece(ev: ProcEvent, binary: boolean): Piece {
  const msg = create(StartResponseSchema, { event: toProto(ev) });
  const bytes = binary ? toBinary(StartResponseSchema, msg) : enc.encode(toJsonString(StartResponseSchema, msg));
  return { size: bytes.byteLength, write: (buf, off) => buf.set(bytes, off) };
}

/** Envelopes of `events`, in order, in one buffer. */
export function encodeEvents(events: ProcEvent[], binary: boolean): Uint8Array {
  const pieces = events.map((ev) => (ev.kind === "data" ? dataPiece(ev.stream, ev.data, binary) : otherPiece(ev, binary)));
  let total = 0;
  for (const p of pieces) total += ENVELOPE_HEADER_BYTES + p.size;
  const buf = Buffer.allocUnsafe(total);
  let off = 0;
  for (const p of pieces) {
    writeEnvelopeHeader(buf, off, p.size);
    p.write(buf, off + ENVELOPE_HEADER_BYTES);
    off += ENVELOPE_HEADER_BYTES + p.size;
  }
  return buf;
}
