export { log, logger } from "./log.ts";
