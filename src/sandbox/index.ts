/**
 * The sandbox assembly: the adapter that implements the orchestrator's `SandboxRuntime` port
 * with real parts (network slot + root disk export + VMM + envd `/init`), sandboxes started
 * from committed snapshots (src/snapshot) with shared memory images, the commit of a template's
 * snapshot (`commitTemplateSnapshot`) and template build VMs, below the orchestrator's plain
 * state machine.
 */
export { createVmRuntime, snapshotServices, vmRuntimeOptions } from "./factory.ts";
export { VmRuntime } from "./vm-runtime.ts";
export type { VmRuntimeOptions } from "./options.ts";
export { snapshotInfo } from "./base-resolver.ts";
export type { StartTimings } from "./launcher.ts";
export type { CaptureReport } from "./captures.ts";
export { memoryKey } from "./capture.ts";
export { parseVmState, pinnedTemplateLayers, type VmState } from "./vm-state.ts";
export { captureVm, commitUpper, kernelKey, templateManifest, type CapturedVm } from "./capture.ts";
export { commitTemplateSnapshot, TEMPLATE_GUEST_MAC, type TemplateSnapshotResult } from "./template-snapshot.ts";
export { diskMemoryExporter, MEMORY_IMAGE_FILE } from "./memory-export.ts";
export { initEnvd } from "./envd-client.ts";
export { waitEnvdHealthy } from "./envd-health.ts";
