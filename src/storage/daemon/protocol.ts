/**
 * Wire protocol between the node and the disk daemon (`agentenv ublk-daemon`), modelled on the
 * upstream ublk daemon's (../shared/docs/upstream-agentenv.md, "wire protocol"): a Unix stream
 * socket; each message is a frame of a 4-byte big-endian length followed by that many bytes of
 * UTF-8 JSON; an object tagged by `kind` (snake_case). Requests may carry a `seq` number that the
 * response echoes, so several requests can be in flight on one connection.
 *
 * Bad input gets a typed answer, never a crash or a silent drop:
 * - a frame longer than the limit: `invalid_request` with code `disk.frame_too_large`, then the
 *   connection is closed (its stream can no longer be trusted to be in step);
 * - bytes that are not a JSON object: `invalid_request`, code `disk.malformed_frame`;
 * - an unknown `kind` or a bad field: `invalid_request`, code `disk.bad_request` naming the field;
 * - a valid request that fails: `error` with the failure's code (`disk.not_found`, ...).
 *
 * Besides answers, the daemon sends every connection an event without `seq` when a handed-out
 * device is lost (its kernel object ended without a request, or a restarted daemon could not
 * serve it again): `{kind: "device_lost", dev_id, engine, reason, at}`. Devices lost before a
 * connection existed are in the `list` answer's `lost`.
 */
import { ChunkQueue } from "../../util/chunk-queue.ts";
import { DiskError, toDiskError } from "../errors.ts";
import type { Response } from "./messages.ts";

export { parseRequest, parseResponse, REQUEST_KINDS } from "./messages.ts";
export type { DeviceInfo, DeviceStats, EngineName, FuseSpec, LostInfo, ReadResponse, Request, Response, TargetSpec } from "./messages.ts";

/** Bytes of the length prefix. */
export const FRAME_HEADER = 4;

/**
 * Version of this protocol, in the `features` answer (`protocol`). A node adopts a daemon a
 * previous node left only when it speaks the same version (issue 27); raise it with any change
 * of a request's or answer's meaning. Daemons before adoption existed send no `protocol`.
 */
export const DISK_PROTOCOL_VERSION = 1;

/** Encode one message as a frame. */
export function encodeFrame(msg: object): Uint8Array {
  const body = new TextEncoder().encode(JSON.stringify(msg));
  const out = new Uint8Array(FRAME_HEADER + body.byteLength);
  new DataView(out.buffer).setUint32(0, body.byteLength, false);
  out.set(body, FRAME_HEADER);
  return out;
}

/** One decoded frame, or the reason it is bad. */
export type Frame = { ok: true; value: Record<string, unknown> } | { ok: false; error: DiskError; fatal: boolean };

/**
 * Splits a byte stream into frames. Feed it chunks as they arrive; it yields each complete frame.
 * A frame's length is checked against `maxFrameBytes` as soon as its prefix is in, so at most one
 * frame (plus the chunk that brought it) is ever held; the bytes of a frame spanning many chunks
 * are copied once, when it is complete. After a `fatal` result (an oversize length) it yields
 * nothing more.
 */
export class FrameReader {
  #q = new ChunkQueue();
  /** Length of the frame whose prefix was taken, or -1 while waiting for a prefix. */
  #len = -1;
  #dead = false;
  #utf8 = new TextDecoder("utf-8", { fatal: true });
  constructor(readonly maxFrameBytes: number) {}

  /** Append `chunk` (copied: a socket may reuse its buffer) and return every frame it completes, in order. */
  push(chunk: Uint8Array): Frame[] {
    if (this.#dead) return [];
    this.#q.push(chunk.slice());
    const out: Frame[] = [];
    for (;;) {
      if (this.#len < 0) {
        if (this.#q.length < FRAME_HEADER) break;
        const h = this.#q.take(FRAME_HEADER);
        this.#len = new DataView(h.buffer, h.byteOffset, FRAME_HEADER).getUint32(0, false);
        if (this.#len > this.maxFrameBytes) {
          this.#dead = true;
          out.push({ ok: false, fatal: true, error: new DiskError("disk.frame_too_large", `frame of ${this.#len} bytes exceeds the limit of ${this.maxFrameBytes}`, { length: this.#len, max: this.maxFrameBytes }) });
          this.#q.clear();
          this.#len = -1;
          return out;
        }
      }
      if (this.#q.length < this.#len) break;
      out.push(this.#decode(this.#q.take(this.#len)));
      this.#len = -1;
    }
    return out;
  }

  /** Bytes of an incomplete frame held back (its length prefix included). */
  get pending(): number {
    return this.#q.length + (this.#len >= 0 ? FRAME_HEADER : 0);
  }

  #decode(body: Uint8Array): Frame {
    let v: unknown;
    try {
      v = JSON.parse(this.#utf8.decode(body));
    } catch (e) {
      return { ok: false, fatal: false, error: new DiskError("disk.malformed_frame", `frame is not JSON: ${e instanceof Error ? e.message : String(e)}`, { length: body.byteLength }) };
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) {
      return { ok: false, fatal: false, error: new DiskError("disk.malformed_frame", "frame is not a JSON object", { length: body.byteLength }) };
    }
    return { ok: true, value: v as Record<string, unknown> };
  }
}

/**
 * The `invalid_request` or `error` response for a failure: its code is always a DiskError code
 * (another subsystem's error is `disk.backend_failed` naming its own code, see `toDiskError`).
 */
export function errorResponse(e: unknown, seq: number | undefined, invalid: boolean): Response {
  const err = toDiskError(e);
  return { kind: invalid ? "invalid_request" : "error", ...(seq === undefined ? {} : { seq }), code: err.code, message: err.message, details: err.details };
}
