import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Failures of starting a node. Adding a code: see src/errors.ts. */
export const NODE_ERRORS = {
  "node.already_running": "another live node holds this runtime path or network prefix (details.pid, lockPath)",
  "node.lock_failed": "a node lock file cannot be opened (details.lockPath)",
  "node.listen_failed": "the API address cannot be bound (details.addr)",
} as const satisfies ErrorTable;
/** A NodeError code. */
export type NodeErrorCode = keyof typeof NODE_ERRORS;

/** A node cannot start; the message is one line an operator can act on. */
export class NodeError extends AgentEnvError<NodeErrorCode> {}
