/**
 * From a request to what the runtime is handed: the node's limits on a create (vCPUs, memory,
 * timeout), the record a create stores, the start spec of a create or resume, and how the
 * runtime reaches a running guest.
 */
import type { OrchestratorConfig } from "./config.ts";
import { OrchestratorError } from "./errors.ts";
import { randomHex } from "./ids.ts";
import type { GuestTarget, RuntimeStartSpec } from "./runtime.ts";
import type { CreateSandboxRequest, SandboxLogLine, SandboxRecord, TemplateInfo, VolumeMount } from "./types.ts";

/**
 * vCPUs and memory within this node's limits (`requested`: the request named them, else they are
 * the template's).
 * @throws OrchestratorError bad_request (400) naming the limit (config key) a value passes.
 */
export function checkResources(c: Pick<OrchestratorConfig, "maxCpuCount" | "maxMemoryMB">, cpuCount: number, memoryMB: number, requested: boolean): { cpuCount: number; memoryMB: number } {
  const from = requested ? "requested" : "template's";
  if (!Number.isInteger(cpuCount) || cpuCount < 1 || cpuCount > c.maxCpuCount) {
    throw new OrchestratorError(
      "orchestrator.bad_request",
      `cpuCount ${cpuCount} (${from}) is outside 1..${c.maxCpuCount}, this node's limit [orchestrator] max_cpu_count`,
      { cpuCount, limit: c.maxCpuCount, key: "orchestrator.max_cpu_count" },
    );
  }
  if (!Number.isInteger(memoryMB) || memoryMB < 128 || memoryMB > c.maxMemoryMB) {
    throw new OrchestratorError(
      "orchestrator.bad_request",
      `memoryMB ${memoryMB} (${from}) is outside 128..${c.maxMemoryMB}, this node's limit [orchestrator] max_memory_mb`,
      { memoryMB, limit: c.maxMemoryMB, key: "orchestrator.max_memory_mb" },
    );
  }
  return { cpuCount, memoryMB };
}

/**
 * A sandbox timeout within this node's limit, seconds.
 * @throws OrchestratorError bad_request (400)
 */
export function checkTimeout(c: Pick<OrchestratorConfig, "maxTimeoutSecs">, secs: number): number {
  if (!Number.isInteger(secs) || secs < 0 || secs > c.maxTimeoutSecs) {
    throw new OrchestratorError("orchestrator.bad_request", `timeout must be an integer between 0 and ${c.maxTimeoutSecs} seconds, got ${secs}`, { timeout: secs });
  }
  return secs;
}

/** What a create has settled before its record is stored. */
export interface CreateShape {
  id: string;
  /** Template (or snapshot) id and alias the record shows. */
  shown: { templateId: string; alias: string | null };
  cpuCount: number;
  memoryMB: number;
  volumeMounts: VolumeMount[];
  timeoutSecs: number;
  /** Unix ms. */
  now: number;
}

/** The record of a new sandbox (state creating) created by `req` from `tpl`. */
export function newRecord(req: CreateSandboxRequest, tpl: TemplateInfo, s: CreateShape): SandboxRecord {
  return {
    id: s.id,
    templateId: s.shown.templateId,
    alias: s.shown.alias,
    state: "creating",
    cpuCount: s.cpuCount,
    memoryMB: s.memoryMB,
    diskSizeMB: tpl.diskSizeMB,
    envdVersion: tpl.envdVersion,
    envdAccessToken: req.secure ? randomHex(32) : null,
    // E2B: network.allowPublicTraffic=false makes non-envd ports require this token
    trafficAccessToken: req.network?.allowPublicTraffic === false ? randomHex(32) : null,
    metadata: req.metadata ?? {},
    envVars: req.envVars ?? {},
    autoPause: req.autoPause ?? false,
    autoPauseMemory: req.autoPauseMemory ?? true,
    snapshotKind: null,
    autoResume: req.autoResume ?? false,
    allowInternetAccess: req.allowInternetAccess ?? null,
    network: req.network ?? null,
    volumeMounts: s.volumeMounts,
    endpoint: null,
    runtimeState: null,
    error: null,
    createdAt: s.now,
    startedAt: s.now,
    endAt: s.now + s.timeoutSecs * 1000,
    updatedAt: s.now,
  };
}

/** The create request of a fork child of `parent` from its checkpoint `snapshotId`: the parent's settings, its own lifetime. */
export function forkRequest(parent: SandboxRecord, snapshotId: string, timeoutSecs: number): CreateSandboxRequest {
  return {
    template: snapshotId,
    timeoutSecs,
    autoPause: parent.autoPause,
    autoResume: parent.autoResume,
    metadata: parent.metadata,
    envVars: parent.envVars,
    secure: parent.envdAccessToken !== null,
    allowInternetAccess: parent.allowInternetAccess ?? undefined,
    network: parent.network ?? undefined,
    cpuCount: parent.cpuCount,
    memoryMB: parent.memoryMB,
  };
}

/** What the runtime starts sandbox `r` with (a create or a resume), its log lines going to `onLog`. */
export function startSpec(r: SandboxRecord, template: TemplateInfo, signal: AbortSignal, onLog: (line: SandboxLogLine) => void): RuntimeStartSpec {
  return {
    id: r.id,
    template,
    cpuCount: r.cpuCount,
    memoryMB: r.memoryMB,
    envVars: r.envVars,
    envdAccessToken: r.envdAccessToken,
    allowInternetAccess: r.allowInternetAccess,
    network: r.network,
    volumes: r.volumeMounts,
    signal,
    onLog,
  };
}

/** A paused sandbox's template as its record has it (when the runtime no longer lists it). */
export function templateOf(r: SandboxRecord): TemplateInfo {
  return { templateID: r.templateId, aliases: r.alias ? [r.alias] : [], cpuCount: r.cpuCount, memoryMB: r.memoryMB, diskSizeMB: r.diskSizeMB, envdVersion: r.envdVersion, createdAt: r.createdAt, updatedAt: r.createdAt, buildID: "", buildStatus: "ready" };
}

/** How the runtime reaches running sandbox `r`'s envd. */
export function targetOf(r: SandboxRecord): GuestTarget {
  return { id: r.id, endpoint: r.endpoint!, envdAccessToken: r.envdAccessToken };
}
