/**
 * The messages of the disk daemon protocol (./protocol.ts) as TypeBox schemas, and their types
 * derived from them: a request the daemon reads and an answer the node reads are checked field
 * by field, never cast. A request's faults are named by field (`details.field`, dotted, e.g.
 * `target.upper.index`); the rules that span fields (a shared device must be read-only, an upper
 * size needs an upper) follow the schema check.
 */
import { Type as T, type Static } from "@sinclair/typebox";
import { jsonSchema, jsonSchemas, type JsonProblem } from "../../util/json-check.ts";
import { DiskError, type DiskErrorCode } from "../errors.ts";

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

/** An absolute path without a `..` segment or NUL, at most PATH_MAX bytes. */
const ABS_PATH = T.String({ pattern: "^/(?!(?:[^/]*/)*\\.\\.(?:/|$))[^\\u0000]*$", maxLength: 4096, description: "must be an absolute path without '..'" });
const ID_TEXT = "must be 1-128 of [A-Za-z0-9_.-], starting alphanumeric";
const DEV_ID = T.String({ pattern: "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", description: ID_TEXT });
const FILE_NAME = T.String({ pattern: "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", description: "must be a plain file name" });
const SEQ = T.Optional(T.Integer({ minimum: 0, maximum: MAX_SAFE, description: "must be a non-negative integer" }));
const BOOL = T.Boolean({ description: "must be a boolean" });
const COUNT = T.Integer({ minimum: 0, maximum: MAX_SAFE });

/** Export engines. */
const ENGINE = T.Union([T.Literal("fuse"), T.Literal("ublk")], { description: 'must be "fuse" or "ublk"' });
export type EngineName = Static<typeof ENGINE>;

const UPPER = T.Object({ data: ABS_PATH, index: ABS_PATH }, { description: "must be {data, index}" });

const RAW_TARGET = T.Object({ kind: T.Literal("raw"), path: ABS_PATH, read_only: BOOL, accept_writable_open: T.Optional(BOOL) });
const OVERLAYBD_TARGET = T.Object({
  kind: T.Literal("overlaybd"),
  /** Read-only layer files, bottom first. */
  lowers: T.Array(ABS_PATH, { minItems: 1, maxItems: 255, description: "must be a list of 1..255 layer paths" }),
  /** Writable upper; absent = a read-only image. */
  upper: T.Optional(UPPER),
  /** Open the upper O_RDONLY and refuse writes (one of several readers of a volume). */
  upper_read_only: T.Optional(BOOL),
  /** Create the upper when its data file does not exist, with this virtual size (0 = the lowers' size). */
  create_upper_size: T.Optional(T.Integer({ minimum: 0, maximum: MAX_SAFE, multipleOf: 512, description: "must be a non-negative multiple of 512" })),
  /** For a read-only stack: accept read-write opens (WRITE still refused). A VMM maps guest RAM that way. */
  accept_writable_open: T.Optional(BOOL),
});
const TARGET = T.Union([RAW_TARGET, OVERLAYBD_TARGET]);
const TARGETS = { raw: jsonSchema(RAW_TARGET), overlaybd: jsonSchema(OVERLAYBD_TARGET) };
/** What to serve. Paths are absolute; sizes in bytes (multiples of 512). */
export type TargetSpec = Static<typeof TARGET>;

/** Where and how a FUSE export appears (ignored by ublk). */
const FUSE = T.Object(
  {
    /** Directory to mount on (absolute); default: one under the daemon's directory. */
    mount_point: T.Optional(ABS_PATH),
    /** Name of the file inside the mount (default "disk.img"). */
    file_name: T.Optional(FILE_NAME),
    /** FOPEN_DIRECT_IO on the served file (default from config). */
    direct_io: T.Optional(BOOL),
  },
  { description: "must be an object" },
);
export type FuseSpec = Static<typeof FUSE>;

/** Requests, by `kind`. */
const REQUESTS = {
  get_features: T.Object({ kind: T.Literal("get_features"), seq: SEQ }),
  create_runtime_device: T.Object({ kind: T.Literal("create_runtime_device"), seq: SEQ, dev_id: DEV_ID, engine: T.Optional(ENGINE), target: TARGET, fuse: T.Optional(FUSE) }),
  delete: T.Object({ kind: T.Literal("delete"), seq: SEQ, dev_id: DEV_ID }),
  restack_snapshot: T.Object({
    kind: T.Literal("restack_snapshot"),
    seq: SEQ,
    dev_id: DEV_ID,
    output_layer_path: T.Union([T.Null(), ABS_PATH], { description: "must be an absolute path without '..', or null" }),
    next_upper: UPPER,
  }),
  acquire: T.Object({
    kind: T.Literal("acquire"),
    seq: SEQ,
    /** exclusive: a device for one sandbox, from the warm pool when one fits; shared: one read-only device per `share_key`, refcounted. */
    access_mode: T.Union([T.Literal("exclusive"), T.Literal("shared")], { description: 'must be "exclusive" or "shared"' }),
    /** exclusive: the id to give the device; shared: ignored (the id derives from `share_key`). */
    dev_id: T.Optional(DEV_ID),
    share_key: T.Optional(T.String({ pattern: "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", description: ID_TEXT })),
    engine: T.Optional(ENGINE),
    target: TARGET,
    fuse: T.Optional(FUSE),
  }),
  release: T.Object({ kind: T.Literal("release"), seq: SEQ, dev_id: DEV_ID }),
  update_size: T.Object({
    kind: T.Literal("update_size"),
    seq: SEQ,
    dev_id: DEV_ID,
    new_size: T.Integer({ minimum: 512, maximum: MAX_SAFE, multipleOf: 512, description: "must be a positive multiple of 512 (bytes)" }),
  }),
  hold: T.Object({
    kind: T.Literal("hold"),
    seq: SEQ,
    dev_id: DEV_ID,
    holder_pid: T.Integer({ minimum: 1, maximum: 2 ** 31 - 1, description: "must be a pid" }),
    holder_fd: T.Integer({ minimum: 0, maximum: 2 ** 31 - 1, description: "must be an fd number" }),
  }),
  list: T.Object({ kind: T.Literal("list"), seq: SEQ }),
  stats: T.Object({ kind: T.Literal("stats"), seq: SEQ, dev_id: DEV_ID }),
  shutdown: T.Object({ kind: T.Literal("shutdown"), seq: SEQ }),
};
type RequestKind = keyof typeof REQUESTS;
/** Requests, by `kind`. */
export type Request = { [K in RequestKind]: Static<(typeof REQUESTS)[K]> }[RequestKind];
const REQUEST_CHECKS = jsonSchemas(REQUESTS);

/** The kinds of request. */
export const REQUEST_KINDS = Object.keys(REQUESTS) as RequestKind[];

/** A device as the daemon reports it. */
const DEVICE_INFO_FIELDS = {
  dev_id: T.String(),
  engine: ENGINE,
  /** What a VMM opens: the file on the FUSE mount, or /dev/ublkbN. */
  path: T.String(),
  access: T.Union([T.Literal("exclusive"), T.Literal("shared")]),
  refcount: COUNT,
  /** FUSE only: the connection fd in the daemon, to copy with pidfd_getfd and report back with `hold`. */
  fuse_fd: T.Optional(COUNT),
};
const DEVICE_INFO = T.Object(DEVICE_INFO_FIELDS);
export type DeviceInfo = Static<typeof DEVICE_INFO>;

/** Counters of one device. */
const DEVICE_STATS = T.Object({
  /** READ requests answered with data, and their bytes. */
  reads: COUNT,
  bytes_read: COUNT,
  writes: COUNT,
  bytes_written: COUNT,
  fsyncs: COUNT,
  discards: COUNT,
  /** open(2)s of the served file (FUSE OPEN requests). */
  opens: COUNT,
  errors: COUNT,
  /** READs of `reads` answered by splice(2) without a copy in the daemon (FUSE engine). */
  spliced_reads: COUNT,
  /** How many times the daemon opened the image's files for this device (1 unless it restarted). */
  image_opens: COUNT,
  refcount: COUNT,
});
export type DeviceStats = Static<typeof DEVICE_STATS>;

/** A handed-out device that is gone without a request (see ./protocol.ts). */
const LOST_INFO_FIELDS = {
  dev_id: T.String(),
  engine: ENGINE,
  reason: T.String(),
  /** ms since the epoch */
  at: T.Number(),
};
const LOST_INFO = T.Object(LOST_INFO_FIELDS);
export type LostInfo = Static<typeof LOST_INFO>;

/** An error answer; its fields are read leniently (./client.ts names an unknown code). */
const FAILURE = { seq: SEQ, code: T.Optional(T.Unknown()), message: T.Optional(T.Unknown()), details: T.Optional(T.Unknown()) };

/** Responses, by `kind` (`device_lost` is an event: no request asked for it). */
const RESPONSES = {
  features: T.Object({
    kind: T.Literal("features"),
    seq: SEQ,
    version: T.String(),
    /** ./protocol.ts DISK_PROTOCOL_VERSION; absent from daemons older than it. */
    protocol: T.Optional(COUNT),
    pid: COUNT,
    engines: T.Array(ENGINE),
    default_engine: ENGINE,
    ublk_control: T.Boolean(),
    max_frame_bytes: COUNT,
    fuse_threads: COUNT,
    restarts_recovered: COUNT,
    pooled: T.Object({ fuse: T.Optional(COUNT), ublk: T.Optional(COUNT) }),
  }),
  runtime_device_created: T.Object({ kind: T.Literal("runtime_device_created"), seq: SEQ, ...DEVICE_INFO_FIELDS }),
  device_acquired: T.Object({ kind: T.Literal("device_acquired"), seq: SEQ, from_pool: T.Boolean(), ...DEVICE_INFO_FIELDS }),
  deleted: T.Object({ kind: T.Literal("deleted"), seq: SEQ, dev_id: T.String() }),
  released: T.Object({ kind: T.Literal("released"), seq: SEQ, dev_id: T.String(), refcount: COUNT }),
  restack_snapshot_created: T.Object({ kind: T.Literal("restack_snapshot_created"), seq: SEQ, dev_id: T.String(), layer_path: T.String(), stats: T.Object({ layers: COUNT, ms: T.Number() }) }),
  size_updated: T.Object({ kind: T.Literal("size_updated"), seq: SEQ, dev_id: T.String(), size: COUNT }),
  devices: T.Object({ kind: T.Literal("devices"), seq: SEQ, devices: T.Array(DEVICE_INFO), lost: T.Array(LOST_INFO) }),
  device_stats: T.Object({ kind: T.Literal("device_stats"), seq: SEQ, dev_id: T.String(), stats: DEVICE_STATS }),
  ok: T.Object({ kind: T.Literal("ok"), seq: SEQ }),
  device_lost: T.Object({ kind: T.Literal("device_lost"), ...LOST_INFO_FIELDS }),
  invalid_request: T.Object({ kind: T.Literal("invalid_request"), ...FAILURE }),
  error: T.Object({ kind: T.Literal("error"), ...FAILURE }),
};
type ResponseKind = keyof typeof RESPONSES;
/** Responses as the daemon sends them (failures with a DiskError code, message and details). */
export type Response =
  | { [K in Exclude<ResponseKind, "invalid_request" | "error">]: Static<(typeof RESPONSES)[K]> }[Exclude<ResponseKind, "invalid_request" | "error">]
  | { kind: "invalid_request" | "error"; seq?: number; code: DiskErrorCode; message: string; details: Record<string, unknown> };
/** A response as the node reads it: failures' fields not yet trusted. */
export type ReadResponse = { [K in ResponseKind]: Static<(typeof RESPONSES)[K]> }[ResponseKind];
const RESPONSE_CHECKS = jsonSchemas(RESPONSES);

/** `/a/0/b` as the dotted field `a.b` (list indexes left out: the list is the field). */
function fieldOf(path: string): string {
  return path.split("/").filter((s) => s !== "" && !/^\d+$/.test(s)).join(".");
}

/** The value at a dotted field of `v` (null when absent), for `details.value`. */
function valueAt(v: Record<string, unknown>, field: string): unknown {
  const x = field.split(".").reduce<unknown>((o, k) => (o && typeof o === "object" ? (o as Record<string, unknown>)[k] : undefined), v);
  return x === undefined ? null : x;
}

function badRequest(v: Record<string, unknown>, field: string, why: string): never {
  throw new DiskError("disk.bad_request", `bad request: ${field} ${why}`, { field, value: valueAt(v, field) as never });
}

function refuse(v: Record<string, unknown>, prefix: string, p: JsonProblem): never {
  const field = [prefix, fieldOf(p.path)].filter(Boolean).join(".");
  return badRequest(v, field, p.expected ?? p.message);
}

/**
 * Check a decoded frame against the request shapes.
 * @throws DiskError `disk.bad_request` naming the field at fault (details.field, details.value)
 */
export function parseRequest(v: Record<string, unknown>): Request {
  const kind = v.kind;
  if (typeof kind !== "string" || !Object.hasOwn(REQUESTS, kind)) return badRequest(v, "kind", `must be one of ${REQUEST_KINDS.join(", ")}`);
  // the target first, by its own kind: its faults are then named by field, not as "no union member matched"
  if (v.target !== undefined) {
    const t = v.target;
    if (typeof t !== "object" || t === null || Array.isArray(t)) return badRequest(v, "target", "must be an object");
    const tk = (t as Record<string, unknown>).kind;
    if (tk !== "raw" && tk !== "overlaybd") return badRequest(v, "target.kind", 'must be "raw" or "overlaybd"');
    const r = TARGETS[tk].check(t);
    if (!r.ok) return refuse(v, "target", r.problem);
  }
  const r = REQUEST_CHECKS[kind as RequestKind].check(v);
  if (!r.ok) return refuse(v, "", r.problem);
  const req: Request = r.value;
  // rules that span fields
  if ("target" in req && req.target.kind === "overlaybd") {
    const t = req.target;
    if (t.upper_read_only !== undefined && t.upper === undefined) badRequest(v, "target.upper_read_only", "must be a boolean, with an upper");
    if (t.create_upper_size !== undefined && t.upper === undefined) badRequest(v, "target.create_upper_size", "needs an upper");
  }
  if (req.kind === "acquire") {
    if (req.access_mode === "exclusive" && req.dev_id === undefined) badRequest(v, "dev_id", ID_TEXT);
    if (req.access_mode === "shared") {
      if (req.share_key === undefined) badRequest(v, "share_key", ID_TEXT);
      const t = req.target;
      if ((t.kind === "raw" && !t.read_only) || (t.kind === "overlaybd" && t.upper !== undefined && t.upper_read_only !== true)) badRequest(v, "target", "of a shared device must be read-only");
    }
  }
  return req;
}

/**
 * Check a decoded frame against the response shapes.
 * @returns the response, or what is wrong with it (`field` dotted, "" for the kind itself)
 */
export function parseResponse(v: Record<string, unknown>): { ok: true; value: ReadResponse } | { ok: false; field: string; why: string } {
  const kind = v.kind;
  if (typeof kind !== "string" || !Object.hasOwn(RESPONSES, kind)) return { ok: false, field: "kind", why: `unknown response kind ${JSON.stringify(kind ?? null)}` };
  const r = RESPONSE_CHECKS[kind as ResponseKind].check(v);
  if (!r.ok) return { ok: false, field: fieldOf(r.problem.path), why: r.problem.expected ?? r.problem.message };
  return { ok: true, value: r.value };
}

/** Schemas of the parts the device store persists (./store.ts). */
export const PERSISTED = {
  target: jsonSchema(TARGET),
  fuse: jsonSchema(FUSE),
  engine: jsonSchema(ENGINE),
  engineState: jsonSchema(T.Record(T.String(), T.Unknown())),
  access: jsonSchema(T.Union([T.Literal("exclusive"), T.Literal("shared"), T.Literal("pool")])),
};
