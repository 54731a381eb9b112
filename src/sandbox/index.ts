/**
 * The sandbox assembly: the adapter that implements the orchestrator's `SandboxRuntime` port
 * with real parts (network slot + root disk export + VMM + envd `/init`), sandboxes started
 * from committed snapshots (src/snapshot) with shared memory images, the commit of a template's
 * snapshot (`commitTemplateSnapshot`) and template build VMs, below the orchestrator's plain
 * state machine.
 */
export { createVmRuntime, snapshotServices, vmRuntimeOptions } from "./factory.ts";
export { snapshotInfo, VmRuntime, type CaptureReport, type StartTimings, type VmRuntimeOptions } from "./vm-runtime.ts";
export { memoryKey } from "./capture.ts";
export { parseVmState, pinnedTemplateLayers, type VmState } from "./vm-state.ts";
export { captureVm, commitUpper, kernelKey, templateManifest, type CapturedVm } from "./capture.ts";
export { commitTemplateSnapshot, TEMPLATE_GUEST_MAC, type TemplateSnapshotResult } from "./template-snapshot.ts";
export { diskMemoryExporter, MEMORY_IMAGE_FILE } from "./memory-export.ts";
export { initEnvd, waitEnvdHealthy } from "./envd-client.ts";
