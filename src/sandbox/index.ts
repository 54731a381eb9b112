/**
 * The sandbox assembly: the adapter that implements the orchestrator's `SandboxRuntime` port
 * with real parts (network slot + root disk export + VMM + envd `/init`). Snapshots, block
 * exports and template builds plug in here, below the orchestrator's plain state machine.
 */
export { createVmRuntime } from "./factory.ts";
export { VmRuntime, snapshotFiles, type VmRuntimeOptions } from "./vm-runtime.ts";
export { initEnvd, waitEnvdHealthy } from "./envd-client.ts";
export { copyRootImage } from "./root-disk.ts";
