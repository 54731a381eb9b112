import { AgentEnvError } from "../../src/errors.ts";

/** Stable codes of scheduler errors. */
export type SchedulerErrorCode =
  | "scheduler.bad_request"
  | "scheduler.not_found"
  | "scheduler.no_nodes"
  | "scheduler.bad_config"
  | "scheduler.store_failed"
  | "scheduler.discovery_failed";

/**
 * Errors of the scheduler (services/scheduler). The gRPC layer maps them to status codes:
 * bad_request → INVALID_ARGUMENT, not_found → NOT_FOUND, no_nodes and store_failed →
 * UNAVAILABLE; bad_config and discovery_failed stop `agentenv scheduler` at start.
 */
export class SchedulerError extends AgentEnvError {
  declare readonly code: SchedulerErrorCode;
  constructor(code: SchedulerErrorCode, message: string, details: Record<string, unknown> = {}, options?: ErrorOptions) {
    super(code, message, details, options);
  }
}
