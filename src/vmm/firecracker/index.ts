/**
 * Firecracker VMM driver (production VMM). `createFirecrackerDriver(cfg)` (used by
 * `createDriver` in ../index.ts) or `new FirecrackerDriver({ config: firecrackerConfig(cfg), runtimeDir })`
 * implements `VmmDriver` from ../types.ts; request builders are exported for inspection.
 */
import { type Config } from "../../config/index.ts";
import { firecrackerConfig } from "./config.ts";
import { FirecrackerDriver } from "./driver.ts";

/**
 * The driver configured by `[firecracker]`, `[vm]` and `runtime_path`.
 * @throws VmmError `vmm.bad_config`
 */
export function createFirecrackerDriver(cfg: Config): FirecrackerDriver {
  return new FirecrackerDriver({ config: firecrackerConfig(cfg), runtimeDir: cfg.runtime_path });
}

export { FirecrackerApi, type ApiRequest } from "./api.ts";
export { firecrackerConfig, type FirecrackerConfig } from "./config.ts";
export { DIRTY_MEM_FILE, FirecrackerDriver, pageRanges, type FirecrackerDriverOptions } from "./driver.ts";
export { bootArgs, bootRequests, IFACE_ID, restoreRequests, snapshotCreateRequest, validateSpec, vmStateRequest } from "./requests.ts";
