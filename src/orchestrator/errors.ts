import { AgentEnvError } from "../errors.ts";

/**
 * Errors of the orchestrator. `status` is the HTTP status the API answers with (E2B's choice
 * for the same situation, see /work/shared/docs/e2b-contract.md §2.3–2.4); `code` is stable.
 * Codes: orchestrator.not_found (404), orchestrator.template_not_found (404),
 * orchestrator.conflict (409), orchestrator.bad_request (400), orchestrator.capacity (429),
 * orchestrator.busy (409, lock wait timed out), orchestrator.create_failed (500),
 * orchestrator.runtime_failed (500), orchestrator.bad_transition (500: a bug).
 */
export class OrchestratorError extends AgentEnvError {
  readonly status: number;
  constructor(code: string, status: number, message: string, details: Record<string, unknown> = {}, options?: ErrorOptions) {
    super(code, message, details, options);
    this.status = status;
  }
}

/** The sandbox does not exist (or is killed): HTTP 404. */
export function notFound(id: string): OrchestratorError {
  return new OrchestratorError("orchestrator.not_found", 404, `sandbox "${id}" doesn't exist or you don't have access to it`, { sandboxId: id });
}
