/**
 * Build the VM runtime from the node config: VMM driver (`[vm]`), network manager (`[network]`,
 * started here: it reaps slots a crashed run left, after leftover VMMs are killed), guest kernel.
 */
import { get, type ConfigTable } from "../config/index.ts";
import type { Db } from "../db/index.ts";
import { netConfigFromConfig, NetworkManager } from "../net/index.ts";
import { createDriver, reapLeftovers, resolveKernelPath } from "../vmm/index.ts";
import type { OrchestratorConfig } from "./config.ts";
import { VmRuntime } from "./vm-runtime.ts";

/**
 * Create and start the VM runtime.
 * @throws VmmError (bad driver config), NetError (host networking setup failed).
 */
export async function createVmRuntime(cfg: ConfigTable, db: Db, oc: OrchestratorConfig): Promise<VmRuntime> {
  const runtimePath = get<string>(cfg, "runtime_path");
  const driver = await createDriver(cfg);
  // VMMs first: a slot must not be torn down under a VMM that still runs in it
  await reapLeftovers(runtimePath);
  const net = new NetworkManager(netConfigFromConfig(cfg), db);
  await net.start();
  let kernel: string | undefined;
  return new VmRuntime({
    homePath: get<string>(cfg, "home_path"),
    runtimePath,
    kernelPath: () => (kernel ??= resolveKernelPath(cfg)),
    driver,
    net,
    defaultCpuCount: oc.defaultCpuCount,
    defaultMemoryMB: oc.defaultMemoryMB,
    envdPollMs: oc.envdPollMs,
    defaultUser: "user",
    onClose: () => net.shutdown(),
  });
}
