/**
 * What nodes, the scheduler and the gateway share about the cluster: the scheduler's gRPC
 * contract (proto/: messages, the nice-grpc service definition, channels to the scheduler).
 * Lives under src/ so the node's reporter (src/observability) needs nothing from services/;
 * services/ import it from here.
 */
export * from "./proto/index.ts";
