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
import { DiskError, type DiskErrorCode, toDiskError } from "./errors.ts";

/** Bytes of the length prefix. */
export const FRAME_HEADER = 4;

/**
 * Version of this protocol, in the `features` answer (`protocol`). A node adopts a daemon a
 * previous node left only when it speaks the same version (issue 27); raise it with any change
 * of a request's or answer's meaning. Daemons before adoption existed send no `protocol`.
 */
export const DISK_PROTOCOL_VERSION = 1;

/** What to serve. Paths are absolute; sizes in bytes (multiples of 512). */
export type TargetSpec =
  | { kind: "raw"; path: string; read_only: boolean; accept_writable_open?: boolean }
  | {
      kind: "overlaybd";
      /** Read-only layer files, bottom first. */
      lowers: string[];
      /** Writable upper; absent = a read-only image. */
      upper?: { data: string; index: string };
      /** Open the upper O_RDONLY and refuse writes (one of several readers of a volume). */
      upper_read_only?: boolean;
      /** Create the upper when its data file does not exist, with this virtual size (0 = the lowers' size). */
      create_upper_size?: number;
      /** For a read-only stack: accept read-write opens (WRITE still refused). A VMM maps guest RAM that way. */
      accept_writable_open?: boolean;
    };

/** Export engines. */
export type EngineName = "fuse" | "ublk";

/** Where and how a FUSE export appears (ignored by ublk). */
export interface FuseSpec {
  /** Directory to mount on (absolute); default: one under the daemon's directory. */
  mount_point?: string;
  /** Name of the file inside the mount (default "disk.img"). */
  file_name?: string;
  /** FOPEN_DIRECT_IO on the served file (default from config). */
  direct_io?: boolean;
}

/** Requests, by `kind`. */
export type Request =
  | { kind: "get_features"; seq?: number }
  | { kind: "create_runtime_device"; seq?: number; dev_id: string; engine?: EngineName; target: TargetSpec; fuse?: FuseSpec }
  | { kind: "delete"; seq?: number; dev_id: string }
  | { kind: "restack_snapshot"; seq?: number; dev_id: string; output_layer_path: string | null; next_upper: { data: string; index: string } }
  | {
      kind: "acquire";
      seq?: number;
      /** exclusive: a device for one sandbox, from the warm pool when one fits; shared: one read-only device per `share_key`, refcounted. */
      access_mode: "exclusive" | "shared";
      /** exclusive: the id to give the device; shared: ignored (the id derives from `share_key`). */
      dev_id?: string;
      share_key?: string;
      engine?: EngineName;
      target: TargetSpec;
      fuse?: FuseSpec;
    }
  | { kind: "release"; seq?: number; dev_id: string }
  | { kind: "update_size"; seq?: number; dev_id: string; new_size: number }
  | { kind: "hold"; seq?: number; dev_id: string; holder_pid: number; holder_fd: number }
  | { kind: "list"; seq?: number }
  | { kind: "stats"; seq?: number; dev_id: string }
  | { kind: "shutdown"; seq?: number };

/** The kinds of request. */
export const REQUEST_KINDS = [
  "get_features", "create_runtime_device", "delete", "restack_snapshot", "acquire", "release", "update_size", "hold", "list", "stats", "shutdown",
] as const;

/** A device as the daemon reports it. */
export interface DeviceInfo {
  dev_id: string;
  engine: EngineName;
  /** What a VMM opens: the file on the FUSE mount, or /dev/ublkbN. */
  path: string;
  access: "exclusive" | "shared";
  refcount: number;
  /** FUSE only: the connection fd in the daemon, to copy with pidfd_getfd and report back with `hold`. */
  fuse_fd?: number;
}

/** Counters of one device. */
export interface DeviceStats {
  /** READ requests answered with data, and their bytes. */
  reads: number;
  bytes_read: number;
  writes: number;
  bytes_written: number;
  fsyncs: number;
  discards: number;
  /** open(2)s of the served file (FUSE OPEN requests). */
  opens: number;
  errors: number;
  /** READs of `reads` answered by splice(2) without a copy in the daemon (FUSE engine). */
  spliced_reads: number;
  /** How many times the daemon opened the image's files for this device (1 unless it restarted). */
  image_opens: number;
  refcount: number;
}

/** A handed-out device that is gone without a request (see the module comment). */
export interface LostInfo {
  dev_id: string;
  engine: EngineName;
  reason: string;
  /** ms since the epoch */
  at: number;
}

/** Responses, by `kind` (`device_lost` is an event: no request asked for it). */
export type Response =
  | { kind: "features"; seq?: number; version: string; protocol?: number; pid: number; engines: EngineName[]; default_engine: EngineName; ublk_control: boolean; max_frame_bytes: number; fuse_threads: number; restarts_recovered: number; pooled: Partial<Record<EngineName, number>> }
  | ({ kind: "runtime_device_created"; seq?: number } & DeviceInfo)
  | ({ kind: "device_acquired"; seq?: number; from_pool: boolean } & DeviceInfo)
  | { kind: "deleted"; seq?: number; dev_id: string }
  | { kind: "released"; seq?: number; dev_id: string; refcount: number }
  | { kind: "restack_snapshot_created"; seq?: number; dev_id: string; layer_path: string; stats: { layers: number; ms: number } }
  | { kind: "size_updated"; seq?: number; dev_id: string; size: number }
  | { kind: "devices"; seq?: number; devices: DeviceInfo[]; lost: LostInfo[] }
  | { kind: "device_stats"; seq?: number; dev_id: string; stats: DeviceStats }
  | { kind: "ok"; seq?: number }
  | ({ kind: "device_lost" } & LostInfo)
  | { kind: "invalid_request"; seq?: number; code: DiskErrorCode; message: string; details: Record<string, unknown> }
  | { kind: "error"; seq?: number; code: DiskErrorCode; message: string; details: Record<string, unknown> };

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
 * After a `fatal` result (an oversize length) it yields nothing more.
 */
export class FrameReader {
  #buf = new Uint8Array(0);
  #dead = false;
  constructor(readonly maxFrameBytes: number) {}

  /** Append `chunk` and return every frame it completes, in order. */
  push(chunk: Uint8Array): Frame[] {
    if (this.#dead) return [];
    const joined = new Uint8Array(this.#buf.byteLength + chunk.byteLength);
    joined.set(this.#buf);
    joined.set(chunk, this.#buf.byteLength);
    const out: Frame[] = [];
    let at = 0;
    while (joined.byteLength - at >= FRAME_HEADER) {
      const len = new DataView(joined.buffer, at).getUint32(0, false);
      if (len > this.maxFrameBytes) {
        this.#dead = true;
        out.push({ ok: false, fatal: true, error: new DiskError("disk.frame_too_large", `frame of ${len} bytes exceeds the limit of ${this.maxFrameBytes}`, { length: len, max: this.maxFrameBytes }) });
        this.#buf = new Uint8Array(0);
        return out;
      }
      if (joined.byteLength - at - FRAME_HEADER < len) break;
      const body = joined.subarray(at + FRAME_HEADER, at + FRAME_HEADER + len);
      at += FRAME_HEADER + len;
      out.push(decodeBody(body));
    }
    this.#buf = joined.slice(at);
    return out;
  }

  /** Bytes of an incomplete frame held back. */
  get pending(): number {
    return this.#buf.byteLength;
  }
}

function decodeBody(body: Uint8Array): Frame {
  let v: unknown;
  try {
    v = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
  } catch (e) {
    return { ok: false, fatal: false, error: new DiskError("disk.malformed_frame", `frame is not JSON: ${(e as Error).message}`, { length: body.byteLength }) };
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    return { ok: false, fatal: false, error: new DiskError("disk.malformed_frame", "frame is not a JSON object", { length: body.byteLength }) };
  }
  return { ok: true, value: v as Record<string, unknown> };
}

const DEV_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const FILE_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

/**
 * Check a decoded frame against the request shapes.
 * @throws DiskError `disk.bad_request` naming the field at fault (details.field, details.value)
 */
export function parseRequest(v: Record<string, unknown>): Request {
  const bad = (field: string, why: string): never => {
    const value = field === "kind" ? v.kind : field.split(".").reduce<unknown>((o, k) => (o && typeof o === "object" ? (o as Record<string, unknown>)[k] : undefined), v);
    throw new DiskError("disk.bad_request", `bad request: ${field} ${why}`, { field, value: value === undefined ? null : (value as never) });
  };
  if (v.seq !== undefined && (!Number.isSafeInteger(v.seq) || (v.seq as number) < 0)) bad("seq", "must be a non-negative integer");
  const kind = v.kind;
  if (typeof kind !== "string" || !(REQUEST_KINDS as readonly string[]).includes(kind)) bad("kind", `must be one of ${REQUEST_KINDS.join(", ")}`);
  const devId = (required: boolean) => {
    if (v.dev_id === undefined && !required) return;
    if (typeof v.dev_id !== "string" || !DEV_ID_RE.test(v.dev_id)) bad("dev_id", "must be 1-128 of [A-Za-z0-9_.-], starting alphanumeric");
  };
  const absPath = (field: string, p: unknown) => {
    if (typeof p !== "string" || !p.startsWith("/") || p.includes("\0") || p.split("/").includes("..")) bad(field, "must be an absolute path without '..'");
  };
  const engine = () => {
    if (v.engine !== undefined && v.engine !== "fuse" && v.engine !== "ublk") bad("engine", 'must be "fuse" or "ublk"');
  };
  const fuse = () => {
    const f = v.fuse;
    if (f === undefined) return;
    if (typeof f !== "object" || f === null || Array.isArray(f)) return bad("fuse", "must be an object");
    const o = f as Record<string, unknown>;
    if (o.mount_point !== undefined) absPath("fuse.mount_point", o.mount_point);
    if (o.file_name !== undefined && (typeof o.file_name !== "string" || !FILE_NAME_RE.test(o.file_name))) bad("fuse.file_name", "must be a plain file name");
    if (o.direct_io !== undefined && typeof o.direct_io !== "boolean") bad("fuse.direct_io", "must be a boolean");
  };
  const upper = (field: string, u: unknown) => {
    if (typeof u !== "object" || u === null) return bad(field, "must be {data, index}");
    absPath(`${field}.data`, (u as Record<string, unknown>).data);
    absPath(`${field}.index`, (u as Record<string, unknown>).index);
  };
  const target = () => {
    const t = v.target as Record<string, unknown> | undefined;
    if (typeof t !== "object" || t === null || Array.isArray(t)) return bad("target", "must be an object");
    if (t.kind === "raw") {
      absPath("target.path", t.path);
      if (typeof t.read_only !== "boolean") bad("target.read_only", "must be a boolean");
      if (t.accept_writable_open !== undefined && typeof t.accept_writable_open !== "boolean") bad("target.accept_writable_open", "must be a boolean");
    } else if (t.kind === "overlaybd") {
      if (!Array.isArray(t.lowers) || t.lowers.length === 0 || t.lowers.length > 255) bad("target.lowers", "must be a list of 1..255 layer paths");
      (t.lowers as unknown[]).forEach((l) => absPath("target.lowers", l));
      if (t.upper !== undefined) upper("target.upper", t.upper);
      if (t.upper_read_only !== undefined && (typeof t.upper_read_only !== "boolean" || t.upper === undefined)) bad("target.upper_read_only", "must be a boolean, with an upper");
      if (t.create_upper_size !== undefined) {
        if (t.upper === undefined) bad("target.create_upper_size", "needs an upper");
        if (!Number.isSafeInteger(t.create_upper_size) || (t.create_upper_size as number) < 0 || (t.create_upper_size as number) % 512 !== 0) bad("target.create_upper_size", "must be a non-negative multiple of 512");
      }
      if (t.accept_writable_open !== undefined && typeof t.accept_writable_open !== "boolean") bad("target.accept_writable_open", "must be a boolean");
    } else bad("target.kind", 'must be "raw" or "overlaybd"');
  };
  switch (kind as Request["kind"]) {
    case "get_features":
    case "list":
    case "shutdown":
      break;
    case "create_runtime_device":
      devId(true);
      engine();
      target();
      fuse();
      break;
    case "delete":
    case "release":
    case "stats":
      devId(true);
      break;
    case "restack_snapshot":
      devId(true);
      if (v.output_layer_path !== null) absPath("output_layer_path", v.output_layer_path);
      upper("next_upper", v.next_upper);
      break;
    case "acquire":
      if (v.access_mode !== "exclusive" && v.access_mode !== "shared") bad("access_mode", 'must be "exclusive" or "shared"');
      if (v.access_mode === "exclusive") devId(true);
      if (v.access_mode === "shared" && (typeof v.share_key !== "string" || !DEV_ID_RE.test(v.share_key))) bad("share_key", "must be 1-128 of [A-Za-z0-9_.-], starting alphanumeric");
      engine();
      target();
      fuse();
      if (v.access_mode === "shared") {
        const t = v.target as Record<string, unknown>;
        if ((t.kind === "raw" && t.read_only !== true) || (t.kind === "overlaybd" && t.upper !== undefined && t.upper_read_only !== true)) bad("target", "of a shared device must be read-only");
      }
      break;
    case "update_size":
      devId(true);
      if (!Number.isSafeInteger(v.new_size) || (v.new_size as number) <= 0 || (v.new_size as number) % 512 !== 0) bad("new_size", "must be a positive multiple of 512 (bytes)");
      break;
    case "hold":
      devId(true);
      if (!Number.isSafeInteger(v.holder_pid) || (v.holder_pid as number) <= 0) bad("holder_pid", "must be a pid");
      if (!Number.isSafeInteger(v.holder_fd) || (v.holder_fd as number) < 0) bad("holder_fd", "must be an fd number");
      break;
  }
  return v as unknown as Request;
}

/**
 * The `invalid_request` or `error` response for a failure: its code is always a DiskError code
 * (another subsystem's error is `disk.backend_failed` naming its own code, see `toDiskError`).
 */
export function errorResponse(e: unknown, seq: number | undefined, invalid: boolean): Response {
  const err = toDiskError(e);
  return { kind: invalid ? "invalid_request" : "error", ...(seq === undefined ? {} : { seq }), code: err.code, message: err.message, details: err.details };
}
