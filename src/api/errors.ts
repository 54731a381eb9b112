/**
 * API-layer errors and the mapping of every error to E2B's body `{code, message, error_code}`.
 */
import { AgentEnvError } from "../errors.ts";
import { logger } from "../observability/log.ts";
import { OrchestratorError } from "../orchestrator/index.ts";

const log = logger("api");

/** Errors raised by the API layer itself (auth, request shape). `status` is the HTTP status. */
export class ApiError extends AgentEnvError {
  readonly status: number;
  constructor(code: string, status: number, message: string, details: Record<string, unknown> = {}) {
    super(code, message, details);
    this.status = status;
  }
}

/** A JSON error response as E2B sends it (the SDK reads `body.code`). */
export function errorResponse(status: number, message: string, errorCode?: string, headers: Record<string, string> = {}): Response {
  return Response.json({ code: status, message, ...(errorCode ? { error_code: errorCode } : {}) }, { status, headers });
}

/**
 * Map any thrown value to an error response; unknown errors become 500 with their message.
 * Every 5xx is logged with the error and its cause chain (which step of a start, pause or
 * resume failed).
 */
export function toErrorResponse(e: unknown): Response {
  const status = e instanceof ApiError || e instanceof OrchestratorError ? e.status : 500;
  if (status >= 500) log.error({ err: e, code: (e as AgentEnvError)?.code, details: (e as AgentEnvError)?.details }, `API answered ${status}: ${(e as Error)?.message ?? String(e)}`);
  // 429 with Retry-After: the SDKs retry it by themselves (e2b-contract.md §2.2)
  if (e instanceof OrchestratorError && e.status === 429) return errorResponse(429, e.message, e.code, { "retry-after": "1" });
  if (e instanceof ApiError || e instanceof OrchestratorError) return errorResponse(e.status, e.message, e.code);
  if (e instanceof AgentEnvError) return errorResponse(500, e.message, e.code);
  return errorResponse(500, e instanceof Error ? e.message : String(e), "api.internal");
}
