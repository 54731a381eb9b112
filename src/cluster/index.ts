/**
 * What nodes, the scheduler and the gateway share about the cluster: the scheduler's gRPC
 * contract (proto/: messages, the nice-grpc service definition, channels to the scheduler) and
 * the facts beside it (contract.ts), and the HTTP headers only the gateway sets on requests to
 * nodes (headers.ts). Lives under src/ so the node's reporter (src/node/reporter.ts) needs
 * nothing from services/; services/ import it from here.
 */
export * from "./proto/index.ts";
export { ERROR_CODE_TRAILER, type NodeRef } from "./contract.ts";
export { GATEWAY_ONLY_HEADERS, TAKE_OVER_HEADER } from "./headers.ts";
