/**
 * Request and response schemas of the node API (TypeBox via Elysia's `t`), named and shaped
 * as E2B's `spec/openapi.yml` (../shared/contracts/e2b/openapi.yml). Integers use
 * `t.Number({multipleOf: 1})`: Elysia's `t.Integer` would coerce strings.
 */
import { t } from "elysia";

const Int = (o: { minimum?: number; maximum?: number; description?: string } = {}) => t.Number({ multipleOf: 1, ...o });
const StrMap = t.Record(t.String(), t.String());

export const ErrorBody = t.Object(
  {
    code: Int({ description: "HTTP status" }),
    message: t.String(),
    error_code: t.Optional(t.String({ description: "stable machine-readable code, e.g. orchestrator.not_found" })),
  },
  { description: "E2B error body" },
);

/**
 * E2B `SandboxNetworkConfig` (create). Every field E2B defines is named here, so strict bodies
 * (./strict.ts) know them; the ones this node does not implement are refused by ./unsupported.ts.
 * `additionalProperties: true` on every body schema: validation must not drop a field the
 * unknown-field check is to see.
 */
export const SandboxNetworkConfig = t.Object(
  {
    allowPublicTraffic: t.Optional(t.Boolean()),
    allowOut: t.Optional(t.Array(t.String())),
    denyOut: t.Optional(t.Array(t.String())),
    maskRequestHost: t.Optional(t.String()),
    egressProxy: t.Optional(t.Any({ description: "E2B SandboxEgressProxyConfig {address, username?, password?} | null" })),
    httpsPorts: t.Optional(t.Any({ description: "E2B: guest ports served as HTTPS" })),
    rules: t.Optional(t.Any({ description: "E2B: host -> [SandboxNetworkRule]" })),
  },
  { additionalProperties: true },
);

/** E2B `SandboxNetworkUpdateConfig` (`PUT /sandboxes/{id}/network`): the body replaces the egress policy. */
export const SandboxNetworkUpdate = t.Object(
  {
    allow_internet_access: t.Optional(t.Boolean()),
    allowOut: t.Optional(t.Array(t.String())),
    denyOut: t.Optional(t.Array(t.String())),
    egressProxy: t.Optional(t.Any({ description: "E2B SandboxEgressProxyConfig | null" })),
    rules: t.Optional(t.Any({ description: "E2B: host -> [SandboxNetworkRule]" })),
  },
  { additionalProperties: true, description: "fields are checked (strictly) by the node's network parser" },
);

const newSandboxFields = {
  templateID: t.String({ minLength: 1, maxLength: 256, description: "template id or alias" }),
  timeout: t.Optional(Int({ minimum: 0, description: "lifetime, seconds" })),
  autoPause: t.Optional(t.Boolean()),
  autoPauseMemory: t.Optional(t.Boolean()),
  autoResume: t.Optional(t.Object({ enabled: t.Boolean() })),
  metadata: t.Optional(t.Union([StrMap, t.Null()])),
  envVars: t.Optional(t.Union([StrMap, t.Null()])),
  mcp: t.Optional(t.Any()),
  iam: t.Optional(t.Any({ description: "E2B SandboxIam (not implemented: refused unless empty)" })),
  network: t.Optional(t.Union([SandboxNetworkConfig, t.Null()])),
  allow_internet_access: t.Optional(t.Boolean()),
  volumeMounts: t.Optional(
    t.Array(
      t.Object({
        name: t.String({ description: "volume name" }),
        path: t.String({ description: "absolute mount path in the guest; not /, /proc, /sys, /dev or below them" }),
        readOnly: t.Optional(t.Boolean({ description: "this node's addition: mount read-only (many readers); default: the one writer" })),
      }),
    ),
  ),
  cpuCount: t.Optional(Int({ minimum: 1, description: "vCPUs (default: the template's); at most [orchestrator] max_cpu_count" })),
  memoryMB: t.Optional(Int({ minimum: 128, description: "guest memory, MiB (default: the template's); at most [orchestrator] max_memory_mb" })),
};

export const NewSandboxV2 = t.Object(newSandboxFields, { additionalProperties: true });
export const NewSandbox = t.Object({ ...newSandboxFields, secure: t.Optional(t.Boolean()) }, { additionalProperties: true });

export const Sandbox = t.Object({
  sandboxID: t.String(),
  templateID: t.String(),
  clientID: t.String(),
  envdVersion: t.String(),
  envdAccessToken: t.Optional(t.String()),
  trafficAccessToken: t.Optional(t.Union([t.String(), t.Null()])),
  domain: t.Optional(t.Union([t.String(), t.Null()])),
  alias: t.Optional(t.String()),
});

const listedFields = {
  templateID: t.String(),
  alias: t.Optional(t.String()),
  sandboxID: t.String(),
  clientID: t.String(),
  startedAt: t.String({ format: "date-time" }),
  endAt: t.String({ format: "date-time" }),
  cpuCount: Int({ minimum: 1 }),
  memoryMB: Int({ minimum: 128 }),
  diskSizeMB: Int({ minimum: 0 }),
  metadata: t.Optional(StrMap),
  state: t.Union([t.Literal("running"), t.Literal("paused")]),
  envdVersion: t.String(),
  volumeMounts: t.Optional(t.Array(t.Object({ name: t.String(), path: t.String() }))),
};

export const ListedSandbox = t.Object(listedFields);
export const SandboxDetail = t.Object({
  ...listedFields,
  envdAccessToken: t.Optional(t.String()),
  allowInternetAccess: t.Optional(t.Union([t.Boolean(), t.Null()])),
  domain: t.Optional(t.Union([t.String(), t.Null()])),
  network: t.Optional(t.Any()),
  lifecycle: t.Optional(t.Object({ autoResume: t.Boolean(), onTimeout: t.Union([t.Literal("kill"), t.Literal("pause")]) })),
});

export const ConnectSandboxV2 = t.Object({ timeout: t.Optional(Int({ minimum: 0 })), memory: t.Optional(t.Boolean()) }, { additionalProperties: true });
export const ConnectSandbox = t.Object({ timeout: Int({ minimum: 0 }), memory: t.Optional(t.Boolean()) }, { additionalProperties: true });
export const ResumedSandbox = t.Object({ timeout: t.Optional(Int({ minimum: 0 })), autoPause: t.Optional(t.Boolean()), memory: t.Optional(t.Boolean()) }, { additionalProperties: true });
export const SandboxTimeout = t.Object({ timeout: Int({ minimum: 0 }) }, { additionalProperties: true });
export const SandboxRefresh = t.Object({ duration: t.Optional(Int({ minimum: 0, maximum: 3600 })) }, { additionalProperties: true });
export const PauseBody = t.Object({ memory: t.Optional(t.Boolean()) }, { additionalProperties: true });

export const ListQuery = t.Object({
  metadata: t.Optional(t.String()),
  state: t.Optional(t.String({ description: "comma-separated: running,paused" })),
  order: t.Optional(t.Union([t.Literal("asc"), t.Literal("desc")])),
  startedAfter: t.Optional(t.String({ format: "date-time" })),
  template: t.Optional(t.String()),
  limit: t.Optional(t.String({ pattern: "^[0-9]+$" })),
  nextToken: t.Optional(t.String()),
});

export const Template = t.Object({
  templateID: t.String(),
  buildID: t.String(),
  cpuCount: Int(),
  memoryMB: Int(),
  diskSizeMB: Int(),
  public: t.Boolean(),
  aliases: t.Array(t.String()),
  names: t.Array(t.String()),
  createdAt: t.String({ format: "date-time" }),
  updatedAt: t.String({ format: "date-time" }),
  createdBy: t.Null(),
  lastSpawnedAt: t.Union([t.String(), t.Null()]),
  spawnCount: Int(),
  buildCount: Int(),
  envdVersion: t.String(),
  buildStatus: t.String(),
});

export const Node = t.Object({
  id: t.String(),
  nodeID: t.String(),
  serviceInstanceID: t.String(),
  clusterID: t.String(),
  status: t.String(),
  statusChangedAt: t.String({ format: "date-time" }),
  sandboxCount: Int(),
  sandboxStartingCount: Int(),
  createSuccesses: Int(),
  createFails: Int(),
  version: t.String(),
  commit: t.String(),
  machineInfo: t.Object({ cpuFamily: t.String(), cpuModel: t.String(), cpuModelName: t.String(), cpuArchitecture: t.String() }),
  metrics: t.Object({
    allocatedCPU: Int(),
    cpuPercent: Int(),
    cpuCount: Int(),
    allocatedMemoryBytes: Int(),
    memoryUsedBytes: Int(),
    memoryTotalBytes: Int(),
    disks: t.Array(t.Any()),
  }),
});

export const SandboxMetric = t.Object({
  timestamp: t.String({ format: "date-time" }),
  timestampUnix: Int({ description: "unix seconds" }),
  cpuCount: Int(),
  cpuUsedPct: t.Number({ description: "percent of all vCPUs, 0..100" }),
  memUsed: Int({ description: "bytes" }),
  memTotal: Int({ description: "bytes" }),
  memCache: Int({ description: "bytes" }),
  diskUsed: Int({ description: "bytes" }),
  diskTotal: Int({ description: "bytes" }),
});

export const SandboxLogEntry = t.Object({
  timestamp: t.String({ format: "date-time" }),
  level: t.Union([t.Literal("debug"), t.Literal("info"), t.Literal("warn"), t.Literal("error")]),
  message: t.String(),
  fields: StrMap,
});

export const SandboxLogs = t.Object({
  logs: t.Array(t.Object({ timestamp: t.String({ format: "date-time" }), line: t.String() })),
  logEntries: t.Array(SandboxLogEntry),
});

export const Uint32 = Int({ minimum: 0, maximum: 4294967295 });

export const Volume = t.Object({ volumeID: t.String(), name: t.String() });
export const VolumeAndToken = t.Object({ volumeID: t.String(), name: t.String(), token: t.String({ description: "Bearer token of /volumecontent/{volumeID}/..." }) });

export const VolumeEntryStat = t.Object({
  name: t.String(),
  path: t.String({ description: "volume-relative" }),
  type: t.Union([t.Literal("file"), t.Literal("directory"), t.Literal("symlink"), t.Literal("unknown")]),
  size: Int({ description: "bytes" }),
  mode: Uint32,
  uid: Uint32,
  gid: Uint32,
  atime: t.String({ format: "date-time" }),
  mtime: t.String({ format: "date-time" }),
  ctime: t.String({ format: "date-time" }),
  target: t.Optional(t.String()),
});
