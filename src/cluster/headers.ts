/**
 * HTTP headers the gateway and the nodes of a cluster agree on (beside the scheduler's gRPC
 * contract). The gateway drops each from its clients' requests: only it may set them.
 */

/**
 * Set by the gateway on a connect or resume it sends to the node the scheduler moved a paused
 * sandbox to (RebindSandbox), its node being gone: the node takes the sandbox over from the
 * shared snapshot store first when it does not have it. Value: the id of the node it comes from.
 */
export const TAKE_OVER_HEADER = "x-agentenv-take-over-from";

/** Headers only the gateway sets. */
export const GATEWAY_ONLY_HEADERS: readonly string[] = [TAKE_OVER_HEADER];
