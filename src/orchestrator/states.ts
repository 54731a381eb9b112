/**
 * The sandbox lifecycle as a table of allowed transitions (TigerStyle: one table, no flags).
 *
 *   creating -> running | failed
 *   running  -> pausing | killing | failed
 *   pausing  -> paused | running | failed      (running: the pause failed, the VM is intact)
 *   paused   -> resuming | killing
 *   resuming -> running | paused | failed      (paused: the restore failed, the snapshot is intact)
 *   killing  -> killed | failed
 *   failed   -> killing | killed               (clean-up of what a failure left)
 *   killed   -> (terminal)
 */
import { OrchestratorError } from "./errors.ts";

export const SANDBOX_STATES = ["creating", "running", "pausing", "paused", "resuming", "killing", "killed", "failed"] as const;
/** Internal lifecycle state of a sandbox. */
export type SandboxState = (typeof SANDBOX_STATES)[number];

export const TRANSITIONS: Readonly<Record<SandboxState, readonly SandboxState[]>> = {
  creating: ["running", "failed"],
  running: ["pausing", "killing", "failed"],
  pausing: ["paused", "running", "failed"],
  paused: ["resuming", "killing"],
  resuming: ["running", "paused", "failed"],
  killing: ["killed", "failed"],
  failed: ["killing", "killed"],
  killed: [],
};

/** Whether `from -> to` is in the table. */
export function canTransition(from: SandboxState, to: SandboxState): boolean {
  return TRANSITIONS[from].includes(to);
}

/**
 * Assert `from -> to` is allowed.
 * @throws OrchestratorError `orchestrator.bad_transition` (a bug in the caller) otherwise.
 */
export function assertTransition(id: string, from: SandboxState, to: SandboxState): void {
  if (!canTransition(from, to)) {
    throw new OrchestratorError("orchestrator.bad_transition", `sandbox ${id}: transition ${from} -> ${to} is not allowed`, { sandboxId: id, from, to });
  }
}

/** States in which the sandbox still exists for API clients (everything else answers 404). */
export const LIVE_STATES: readonly SandboxState[] = ["creating", "running", "pausing", "paused", "resuming"];

/**
 * The E2B-visible state (`running` | `paused`, e2b openapi `SandboxState`) of a live sandbox,
 * or null when it no longer exists for clients.
 */
export function publicState(s: SandboxState): "running" | "paused" | null {
  switch (s) {
    case "creating":
    case "running":
    case "resuming":
      return "running";
    case "pausing":
    case "paused":
      return "paused";
    default:
      return null;
  }
}

/** Parse a stored state string. @throws OrchestratorError `orchestrator.bad_state` for unknown text. */
export function parseState(id: string, s: string): SandboxState {
  if ((SANDBOX_STATES as readonly string[]).includes(s)) return s as SandboxState;
  throw new OrchestratorError("orchestrator.bad_state", `sandbox ${id}: unknown stored state ${JSON.stringify(s)}`, { sandboxId: id, state: s });
}
