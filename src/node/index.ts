/**
 * The node's composition root: locks, database, the VM runtime (src/sandbox), the orchestrator
 * and the HTTP API (src/api), started and stopped in order. `agentenv server` calls `bootNode`.
 */
export { bootNode, type RunningNode, type RuntimeFactory } from "./boot.ts";
export { acquireNodeLocks, netLockPath, type NodeLocks } from "./lock.ts";
export { NodeError, NODE_ERRORS, type NodeErrorCode } from "./errors.ts";
