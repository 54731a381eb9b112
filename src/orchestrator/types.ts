/**
 * Plain data of the orchestrator: sandbox records, create/list requests, templates.
 * Times are unix milliseconds; sizes in MiB as E2B names them (memoryMB, diskSizeMB).
 */
import type { SandboxState } from "./states.ts";

/** Where a sandbox's guest ports are reachable from the host. */
export interface SandboxEndpoint {
  /** Host address the guest's ports are reached at (its address in its slot); guest port P is host:P. */
  host: string;
}

/** One sandbox as the orchestrator stores it. */
export interface SandboxRecord {
  id: string;
  templateId: string;
  alias: string | null;
  state: SandboxState;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  envdVersion: string;
  envdAccessToken: string | null;
  trafficAccessToken: string | null;
  metadata: Record<string, string>;
  envVars: Record<string, string>;
  autoPause: boolean;
  /** false: the timeout's pause keeps only the disk (a filesystem-only snapshot; E2B `autoPauseMemory`). */
  autoPauseMemory: boolean;
  autoResume: boolean;
  /**
   * What the paused sandbox's snapshot holds: "memory" (RAM + devices + disk: a resume continues
   * its processes) or "filesystem" (disk only: a resume cold-boots it); null while not paused.
   */
  snapshotKind: "memory" | "filesystem" | null;
  allowInternetAccess: boolean | null;
  network: Record<string, unknown> | null;
  /** Volumes attached as extra drives and mounted in the guest, in drive order. */
  volumeMounts: VolumeMount[];
  endpoint: SandboxEndpoint | null;
  /**
   * The runtime's state of the sandbox as stored (JSON; null before it started): opaque here,
   * read back only through the runtime's `state.parse` (`SandboxRuntime.state`).
   */
  runtimeState: unknown;
  error: string | null;
  createdAt: number;
  startedAt: number;
  endAt: number;
  updatedAt: number;
}

/** Already-validated create request (the API layer has parsed and checked it). */
export interface CreateSandboxRequest {
  /** Template id or alias. */
  template: string;
  /** Lifetime in seconds; the orchestrator's default when absent. */
  timeoutSecs?: number;
  autoPause?: boolean;
  /** false: pauses at the timeout keep only the disk. Default true. */
  autoPauseMemory?: boolean;
  autoResume?: boolean;
  metadata?: Record<string, string>;
  envVars?: Record<string, string>;
  /** Issue an envd access token (always for v2 create; v1 only with `secure`). */
  secure: boolean;
  allowInternetAccess?: boolean;
  network?: Record<string, unknown>;
  /** vCPUs; the template's when absent. */
  cpuCount?: number;
  /** Guest memory, MiB; the template's when absent. */
  memoryMB?: number;
  /** Volumes to mount, by volume name (E2B `volumeMounts`; `readOnly` is this node's addition). */
  volumeMounts?: { name: string; path: string; readOnly?: boolean }[];
}

/** A persistent volume (E2B `Volume` + its content token). */
export interface VolumeRecord {
  id: string;
  /** DNS label, unique on the node. */
  name: string;
  /** Bearer token of the content API (`/volumecontent/{id}/...`). */
  token: string;
  /** Size of its filesystem, bytes. */
  sizeBytes: number;
  createdAt: number;
}

/** A volume attached to a sandbox: mounted at `path` in the guest, read-only or as its one writer. */
export interface VolumeMount {
  volumeId: string;
  name: string;
  path: string;
  readOnly: boolean;
}

/** Filter of `list()`. */
export interface ListSandboxesQuery {
  /** Public states to include; both when absent. */
  states?: ("running" | "paused")[];
  /** Every pair must match. */
  metadata?: Record<string, string>;
  template?: string;
  /** Unix ms: sandboxes started at or after it (E2B `startedAfter`, inclusive). */
  startedAfter?: number;
  /** By start time; default "desc" (newest first, E2B's default). */
  order?: "asc" | "desc";
  /** 1..100. */
  limit?: number;
  /** Opaque cursor from a previous page. */
  nextToken?: string;
}

/** A template the runtime can boot. */
export interface TemplateInfo {
  templateID: string;
  aliases: string[];
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  envdVersion: string;
  createdAt: number;
  updatedAt: number;
  buildID: string;
  buildStatus: "ready" | "building" | "error" | "waiting";
}

/** A template as the node lists it: what the runtime reports plus persisted spawn statistics. */
export interface TemplateListing extends TemplateInfo {
  /** Sandboxes created (reached running) from this template, ever. */
  spawnCount: number;
  /** When the last of them was created, unix ms; null when never. */
  lastSpawnedAt: number | null;
}

/** Counters the orchestrator publishes (running/starting are gauges, created/failed totals). */
export interface OrchestratorCounters {
  running: number;
  paused: number;
  starting: number;
  created: number;
  failed: number;
  killed: number;
}

/**
 * One resource sample of a sandbox (E2B `SandboxMetric`): taken by the node every
 * `[metrics] sample_interval_ms` while the sandbox runs. Bytes, percent 0..100 of all vCPUs.
 */
export interface SandboxMetricsSample {
  /** When the node took it, unix ms. */
  at: number;
  cpuCount: number;
  cpuUsedPct: number;
  memUsed: number;
  memTotal: number;
  /** Page cache + buffers, bytes. */
  memCache: number;
  diskUsed: number;
  diskTotal: number;
}

/** E2B `LogLevel`, lowest first. */
export const LOG_LEVELS = ["debug", "info", "warn", "error"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Where a sandbox log line came from. */
export type LogSource = "lifecycle" | "console" | "envd";

/** A log line a runtime hands to the orchestrator (`RuntimeStartSpec.onLog`). */
export interface SandboxLogLine {
  /** Unix ms. */
  at: number;
  level: LogLevel;
  source: Exclude<LogSource, "lifecycle">;
  message: string;
  /** Extra string fields (envd's structured keys). */
  fields?: Record<string, string>;
}

/** One entry of a sandbox's log (E2B `SandboxLogEntry` plus its source and order). */
export interface SandboxLogEntry {
  /** Unix ms. */
  at: number;
  level: LogLevel;
  source: LogSource;
  message: string;
  fields: Record<string, string>;
}

/** Query of a sandbox's log (E2B `GET /v2/sandboxes/{id}/logs`), already validated. */
export interface SandboxLogQuery {
  /** Unix ms: forward returns entries at or after it, backward at or before it. */
  cursor?: number;
  /** 0..1000. */
  limit: number;
  direction: "forward" | "backward";
  /** Minimum level. */
  level?: LogLevel;
  /** Case-sensitive substring of the message. */
  search?: string;
}

/** `network` fields about traffic into the sandbox, which `PUT /sandboxes/{id}/network` leaves as they are. */
export const INGRESS_FIELDS = ["allowPublicTraffic", "maskRequestHost", "httpsPorts"] as const;
