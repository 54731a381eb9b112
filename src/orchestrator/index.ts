/** Orchestrator: sandbox lifecycle over a SandboxRuntime. See orchestrator.ts and runtime.ts. */
export { Orchestrator, type ShutdownSummary } from "./orchestrator.ts";
export { encodeCursor, decodeCursor } from "./pages.ts";
export type { ConnectResult, ForkResult, OrchestratorObserver, SandboxEvent, SandboxNote, SandboxService, StopReason } from "./service.ts";
export { FORK_DEFAULT_TIMEOUT_SECS, MAX_FORK_COUNT } from "./service.ts";
export { CREATE_DEFAULT_TIMEOUT_SECS } from "./timeouts.ts";
export { OrchestratorError, ORCHESTRATOR_ERRORS, type OrchestratorErrorCode, isRequestFault, notFound } from "./errors.ts";
export { orchestratorConfig, type OrchestratorConfig } from "./config.ts";
export type {
  GuestTarget, PreparedStarts, ReapReport, RecoveredSandbox, RuntimeKnownSandbox, RuntimeMetrics, RuntimeNetwork, RuntimeSandbox, RuntimeSharedPauses, RuntimeSnapshots, RuntimeStartSpec, RuntimeStateCodec, SandboxRuntime,
  SnapshotInfo,
  SnapshotRequest, VolumeBackend,
} from "./runtime.ts";
export { SANDBOX_STATES, TRANSITIONS, LIVE_STATES, canTransition, publicState, type SandboxState } from "./states.ts";
export { SANDBOX_ID_RE, newSandboxId, randomHex } from "./ids.ts";
export type * from "./types.ts";
export { LOG_LEVELS } from "./types.ts";
export { lifecycleEntry } from "./events.ts";
export { importedRecord, portableRecord, type PortableRecord } from "./portable.ts";
