export { log, logger } from "./log.ts";
export { renderPrometheus, renderSandboxMetrics } from "./metrics.ts";
