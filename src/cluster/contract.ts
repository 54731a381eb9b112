/**
 * What the scheduler and its clients (the gateway, nodes) agree on beside the proto messages.
 */
import type { Node } from "./proto/index.ts";

/** A node as discovery knows it: its id and the base URL of its HTTP API (the proto's `Node`), e.g. `http://10.0.0.7:8000` (no trailing slash). */
export type NodeRef = Node;

/** gRPC trailer naming the scheduler's error code of a failed RPC (`scheduler.no_nodes`, ...: services/scheduler/errors.ts). */
export const ERROR_CODE_TRAILER = "agentenv-error-code";
