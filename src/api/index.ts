/** Node API: E2B-compatible REST routes, auth, sandbox proxy, listener. */
export { buildApp, type ApiDeps, PUBLIC_PATHS } from "./app.ts";
export { ApiError, API_ERRORS, type ApiErrorCode } from "./errors.ts";
export { ERROR_STATUS, ERROR_TABLES, errorResponse, statusOf, toErrorResponse, type ErrorCode } from "./status.ts";
export { loadOrCreateApiKey, apiKeyPath, keyMatches } from "./auth.ts";
export { SandboxProxy, routeOf, badGateway, type ProxyRoute, type ProxyOptions } from "./proxy.ts";
export { serve, parseAddr } from "./server.ts";
export { parseMetadataFilter } from "./metadata.ts";
