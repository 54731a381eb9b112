import { AgentEnvError, type ErrorTable } from "../errors.ts";

/**
 * Every failure of the orchestrator (and of the sandbox runtime behind its port), each with its
 * meaning. The API answers with the status `ERROR_STATUS` (src/api/status.ts) gives the code
 * (E2B's choice for the same situation, see ../shared/docs/e2b-contract.md §2.3–2.4).
 * Adding a code: see src/errors.ts.
 */
export const ORCHESTRATOR_ERRORS = {
  "orchestrator.not_found": "the sandbox does not exist or was killed (details.sandboxId)",
  "orchestrator.template_not_found": "the template named by a create does not exist (details.template)",
  "orchestrator.conflict": "the sandbox is in a state that refuses the operation (details.sandboxId, state)",
  "orchestrator.bad_request": "a request value the orchestrator refuses (timeout, nextToken, network policy)",
  "orchestrator.capacity": "the node is at its limit of live sandboxes (details.limit)",
  "orchestrator.busy": "too many operations queued on one sandbox, or the lock wait timed out",
  "orchestrator.shutting_down": "the node is shutting down and starts nothing new",
  "orchestrator.create_failed": "booting a new sandbox failed (details.sandboxId, template; cause)",
  "orchestrator.runtime_failed": "the runtime failed a kill, pause or resume (details.sandboxId; cause)",
  "orchestrator.envd_unready": "envd in the guest did not answer /health in time, or the VM exited first",
  "orchestrator.envd_init_failed": "envd's POST /init failed (details.status)",
  "orchestrator.envd_failed": "an envd process start, stream or file upload failed (details.base, cmd / guestPath)",
  "orchestrator.template_not_ready": "a template's start command failed or its ready command did not pass at sandbox start (details.sandboxId)",
  "orchestrator.envd_metrics_failed": "envd's GET /metrics failed or answered a non-number (details.base, field)",
  "orchestrator.snapshot_missing": "a paused sandbox's snapshot is gone (details.snapshot)",
  "orchestrator.disk_failed": "preparing the sandbox's root disk failed",
  "orchestrator.bad_transition": "a state transition the state machine does not allow (a bug)",
  "orchestrator.bad_state": "a stored state the state machine does not know (a bug or a newer database)",
  "orchestrator.bad_runtime_state": "a sandbox's stored runtime state does not parse (details.sandboxId, field)",
  "orchestrator.volume_not_found": "the volume does not exist (details.volumeId)",
  "orchestrator.volume_exists": "a volume with this name exists already (details.name)",
  "orchestrator.volume_in_use": "the volume is mounted by sandboxes: no deletion, no writer beside others (details.volumeId, sandboxIds)",
  "orchestrator.volume_busy": "the volume's content cannot be reached now: its writer is not running, or read-only holders refuse a change (details.volumeId)",
  "orchestrator.volume_mount_failed": "mounting a volume in the guest failed (details.volumeId, path)",
} as const satisfies ErrorTable;
/** An OrchestratorError code. */
export type OrchestratorErrorCode = keyof typeof ORCHESTRATOR_ERRORS;

/** A failure of the orchestrator or the sandbox runtime; `code` is stable, `details` names the sandbox. */
export class OrchestratorError extends AgentEnvError<OrchestratorErrorCode> {}

/** Codes that name a fault of the request (not of the runtime): a create passes them through unwrapped. */
const REQUEST_FAULTS: ReadonlySet<OrchestratorErrorCode> = new Set([
  "orchestrator.not_found",
  "orchestrator.template_not_found",
  "orchestrator.conflict",
  "orchestrator.bad_request",
  "orchestrator.capacity",
  "orchestrator.busy",
]);

/** True when `e` is an OrchestratorError caused by the request rather than by the runtime. */
export function isRequestFault(e: unknown): e is OrchestratorError {
  return e instanceof OrchestratorError && REQUEST_FAULTS.has(e.code);
}

/** The sandbox does not exist (or is killed). */
export function notFound(id: string): OrchestratorError {
  return new OrchestratorError("orchestrator.not_found", `sandbox "${id}" doesn't exist or you don't have access to it`, { sandboxId: id });
}
