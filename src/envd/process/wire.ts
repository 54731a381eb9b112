/**
 * Encoding of process events as `StartResponse` / `ConnectResponse` messages (both are
 * `{event: ProcessEvent}` with the same field number), a batch at a time, as parts to write.
 * Data events, the bulk of a stream, are written directly: JSON as
 * `{"event":{"data":{"stdout":"<base64>"}}}` (proto3 JSON: bytes are standard base64 with
 * padding) and binary as nested length-delimited fields (process.proto: StartResponse.event = 1,
 * ProcessEvent.data = 2, DataEvent.stdout = 1 / stderr = 2 / pty = 3). The rare events go through
 * protobuf-es.
 */
import { create, toBinary, toJsonString, type MessageInitShape } from "@bufbuild/protobuf";
import { ENVELOPE_HEADER_BYTES, writeEnvelopeHeader, type StreamParts } from "../connect-stream.ts";
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
const JSON_TAIL = `"}}}`;

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

/** Most bytes of the fixed part of one data event: envelope, tags and varints, or JSON around the base64. */
const DATA_OVERHEAD = ENVELOPE_HEADER_BYTES + 32;

function otherMessage(ev: ProcEvent, binary: boolean): Uint8Array {
  const msg = create(StartResponseSchema, { event: toProto(ev) });
  return binary ? toBinary(StartResponseSchema, msg) : enc.encode(toJsonString(StartResponseSchema, msg));
}

/**
 * Envelopes of `events`, in order, as parts to write one after the other. A data event becomes
 * one message per `maxEventBytes` of its output (the last one shorter); the payload of each
 * message is a part of its own (a view of the output as read, or its base64 text), and the bytes
 * between two payloads (envelope headers, field tags and lengths, JSON punctuation, whole small
 * events) share one buffer per batch.
 */
export function encodeEvents(events: ProcEvent[], binary: boolean, maxEventBytes: number): StreamParts {
  const others = events.map((ev) => (ev.kind === "data" ? undefined : otherMessage(ev, binary)));
  let small = 0;
  for (let i = 0; i < events.length; i++) {
    const ev = events[i]!;
    small += ev.kind === "data" ? DATA_OVERHEAD * Math.max(1, Math.ceil(ev.data.byteLength / maxEventBytes)) : ENVELOPE_HEADER_BYTES + others[i]!.byteLength;
  }
  const buf = Buffer.allocUnsafe(small);
  const parts: StreamParts = [];
  let off = 0;
  let gap = 0;
  const payload = (p: Uint8Array | string) => {
    if (off > gap) parts.push(buf.subarray(gap, off));
    parts.push(p);
    gap = off;
  };
  for (let i = 0; i < events.length; i++) {
    const ev = events[i]!;
    if (ev.kind !== "data") {
      const m = others[i]!;
      writeEnvelopeHeader(buf, off, m.byteLength);
      buf.set(m, off + ENVELOPE_HEADER_BYTES);
      off += ENVELOPE_HEADER_BYTES + m.byteLength;
      continue;
    }
    for (let at = 0; at < ev.data.byteLength || at === 0; at += maxEventBytes) {
      const data = ev.data.subarray(at, at + maxEventBytes);
      if (binary) {
        const n = data.byteLength;
        const inner = 1 + varintSize(n) + n;
        const mid = 1 + varintSize(inner) + inner;
        writeEnvelopeHeader(buf, off, 1 + varintSize(mid) + mid);
        off += ENVELOPE_HEADER_BYTES;
        buf[off++] = TAG_EVENT;
        off = putVarint(buf, off, mid);
        buf[off++] = TAG_DATA;
        off = putVarint(buf, off, inner);
        buf[off++] = DATA_TAG[ev.stream];
        off = putVarint(buf, off, n);
        payload(data);
      } else {
        const b64 = Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64");
        const head = `{"event":{"data":{"${ev.stream}":"`;
        writeEnvelopeHeader(buf, off, head.length + b64.length + JSON_TAIL.length);
        off += ENVELOPE_HEADER_BYTES;
        off += buf.write(head, off, "latin1");
        payload(b64);
        off += buf.write(JSON_TAIL, off, "latin1");
      }
      if (data.byteLength === 0) break;
    }
  }
  if (off > gap) parts.push(buf.subarray(gap, off));
  return parts;
}

/** Total bytes `parts` put on the wire (ASCII text: one byte a character). */
export function partsBytes(parts: StreamParts): number {
  let n = 0;
  for (const p of parts) n += typeof p === "string" ? p.length : p.byteLength;
  return n;
}
