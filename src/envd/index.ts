/**
 * envd: the in-guest daemon speaking E2B's envd protocol (HTTP routes + Connect services).
 * Start it with `startEnvd()` or `agentenv envd`.
 */
export { startEnvd, DEFAULT_ENVD_OPTIONS, type Envd, type EnvdOptions } from "./server.ts";
export { EnvdError, type EnvdErrorKind } from "./errors.ts";
export { ENVD_PORT, ENVD_VERSION } from "./version.ts";
export { fileSignature } from "./http/files.ts";
