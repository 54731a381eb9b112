import { AgentEnvError, type ErrorTable } from "../../src/errors.ts";

/**
 * Stable codes of scheduler errors, each with its meaning. The gRPC layer (grpc.ts) maps them to
 * status codes: bad_request → INVALID_ARGUMENT, not_found → NOT_FOUND, no_nodes, unknown_node
 * and node_alive → FAILED_PRECONDITION, store_failed → UNAVAILABLE; bad_config and
 * discovery_failed stop `agentenv scheduler` at start. Every error status carries its code in
 * the trailer `agentenv-error-code` (ERROR_CODE_TRAILER, src/cluster/contract.ts).
 */
export const SCHEDULER_ERRORS = {
  "scheduler.bad_request": "a malformed request: sandbox or node id, endpoint, event type, protobuf (details name it)",
  "scheduler.not_found": "no binding for the sandbox (details.sandboxId), or no such node (details.nodeId)",
  "scheduler.no_nodes": "no node can take a new sandbox: none discovered, or every one stopped reporting, left or is draining (details.nodes)",
  "scheduler.unknown_node": "a heartbeat or sandbox events from a node discovery does not know (details.nodeId)",
  "scheduler.node_alive": "RebindSandbox of a sandbox whose node is not gone: it reported within rebind_after_secs, or never reported (details.nodeId, details.ageMs)",
  "scheduler.bad_config": "a [scheduler] setting that cannot work (details name the key or entry)",
  "scheduler.store_failed": "the SQLite database or the Redis server failed, or holds a corrupt value",
  "scheduler.discovery_failed": "the first list of Kubernetes EndpointSlices failed (details.apiUrl)",
  "scheduler.bad_event": "a Kubernetes list answer or watch event that is not what the API sends: over its byte bound, not JSON, or a field of the wrong type (details.field names it); discovery lists again",
} as const satisfies ErrorTable;
export type SchedulerErrorCode = keyof typeof SCHEDULER_ERRORS;

/** Errors of the scheduler (services/scheduler). */
export class SchedulerError extends AgentEnvError<SchedulerErrorCode> {}
