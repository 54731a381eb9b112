/**
 * A paused sandbox's record as it travels between nodes. The runtime keeps it with the pause
 * snapshot (in a store the nodes share, `manifest.sandbox.record`), so a node that finds the
 * snapshot there can take the sandbox over under the same id with the same settings: envd and
 * traffic tokens, env vars, metadata, lifecycle (auto-pause, auto-resume), network policy,
 * shape, times. Node-local fields (state, endpoint, runtime state, error) are not in it; a
 * sandbox with volumes does not move (its volumes are this node's).
 */
import { type Static, Type as T } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { OrchestratorError } from "./errors.ts";
import type { SandboxRecord } from "./types.ts";

const STRINGS = T.Record(T.String(), T.String());

/** The portable part of a SandboxRecord, as a schema (checked when read back on another node). */
const PORTABLE = T.Object({
  id: T.String({ pattern: "^[a-z0-9]{1,64}$" }),
  templateId: T.String(),
  alias: T.Union([T.String(), T.Null()]),
  cpuCount: T.Integer({ minimum: 1 }),
  memoryMB: T.Integer({ minimum: 1 }),
  diskSizeMB: T.Integer({ minimum: 0 }),
  envdVersion: T.String(),
  envdAccessToken: T.Union([T.String(), T.Null()]),
  trafficAccessToken: T.Union([T.String(), T.Null()]),
  metadata: STRINGS,
  envVars: STRINGS,
  autoPause: T.Boolean(),
  autoPauseMemory: T.Boolean(),
  autoResume: T.Boolean(),
  snapshotKind: T.Union([T.Literal("memory"), T.Literal("filesystem")]),
  allowInternetAccess: T.Union([T.Boolean(), T.Null()]),
  network: T.Union([T.Record(T.String(), T.Unknown()), T.Null()]),
  createdAt: T.Integer(),
  startedAt: T.Integer(),
  endAt: T.Integer(),
});

/** What another node needs of a paused sandbox's record. */
export type PortableRecord = Static<typeof PORTABLE>;

/**
 * The portable record of sandbox `r` pausing with a `memory` or filesystem-only snapshot, or null
 * when it cannot move (volumes attached).
 */
export function portableRecord(r: SandboxRecord, memory: boolean): PortableRecord | null {
  if (r.volumeMounts.length > 0) return null;
  return {
    id: r.id,
    templateId: r.templateId,
    alias: r.alias,
    cpuCount: r.cpuCount,
    memoryMB: r.memoryMB,
    diskSizeMB: r.diskSizeMB,
    envdVersion: r.envdVersion,
    envdAccessToken: r.envdAccessToken,
    trafficAccessToken: r.trafficAccessToken,
    metadata: r.metadata,
    envVars: r.envVars,
    autoPause: r.autoPause,
    autoPauseMemory: r.autoPauseMemory,
    autoResume: r.autoResume,
    snapshotKind: memory ? "memory" : "filesystem",
    allowInternetAccess: r.allowInternetAccess,
    network: r.network,
    createdAt: r.createdAt,
    startedAt: r.startedAt,
    endAt: r.endAt,
  };
}

/**
 * The paused record of sandbox `id` taken over from another node: `stored` (as that node wrote
 * it) checked, with this node's runtime state for it, at `now` (unix ms).
 * @throws OrchestratorError `orchestrator.bad_runtime_state` naming the field when `stored` is
 *   not a portable record of sandbox `id`
 */
export function importedRecord(id: string, stored: unknown, runtimeState: unknown, now: number): SandboxRecord {
  const first = Value.Errors(PORTABLE, stored).First();
  const bad = (field: string, message: string) =>
    new OrchestratorError("orchestrator.bad_runtime_state", `sandbox ${id}: the record its pause snapshot carries: ${field || "(root)"}: ${message}`, { sandboxId: id, field });
  if (first) throw bad(first.path, first.message);
  const p = stored as PortableRecord;
  if (p.id !== id) throw bad("/id", `names sandbox ${p.id}`);
  return { ...p, state: "paused", volumeMounts: [], endpoint: null, runtimeState, error: null, updatedAt: now };
}
