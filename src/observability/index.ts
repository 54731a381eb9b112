export { log, logger } from "./log.ts";
export { renderPrometheus } from "./metrics.ts";
