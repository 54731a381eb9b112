import { AgentEnvError } from "../errors.ts";

/**
 * Every failure of the VMM layer (drivers, supervision, guest kernel build). `code` is stable,
 * e.g. `vmm.qemu_exited`, `vmm.qmp_error`, `vmm.kernel_build_failed`; `details` names the VM id,
 * path, command or QMP reply at fault.
 */
export class VmmError extends AgentEnvError {}
