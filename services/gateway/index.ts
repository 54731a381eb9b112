/** The gateway (`agentenv gateway`): the cluster's E2B API in front of the nodes. */
export { startGateway, type RunningGateway } from "./server.ts";
export { gatewayConfig, type GatewayConfig } from "./config.ts";
export { Gateway } from "./gateway.ts";
export { dataRoute, hostRoute, DNS_LABEL_MAX, type DataRoute } from "./dataplane.ts";
export { GatewayError, GATEWAY_ERRORS, GATEWAY_STATUS, type GatewayErrorCode } from "./errors.ts";
export { UNREACHABLE_HEADER } from "./aggregate.ts";
