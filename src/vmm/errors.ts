import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Every failure of the VMM layer (drivers, supervision, guest kernel build). Adding a code: see src/errors.ts. */
export const VMM_ERRORS = {
  "vmm.bad_spec": "a VM spec the driver cannot run (details names the field)",
  "vmm.bad_state": "a VM operation in the wrong VM state (details.state)",
  "vmm.not_running": "the VM is not running (details.vmId)",
  "vmm.not_paused": "the VM must be paused for this operation (details.vmId)",
  "vmm.spawn_failed": "the VMM process could not start or exited during boot (details: stderr tail)",
  "vmm.driver_unavailable": "the configured VMM is not installed (details.driver)",
  "vmm.qmp_connect": "QEMU's QMP socket did not accept a connection in time (details.socket)",
  "vmm.qmp_closed": "the QMP connection closed (QEMU exited)",
  "vmm.qmp_error": "QEMU answered a QMP command with an error (details.command, error)",
  "vmm.qmp_timeout": "a QMP command got no answer in time (details.command, timeoutMs)",
  "vmm.qmp_bad_message": "QEMU sent a QMP line that is not JSON, not a QMP message, or over the line bound (details.reason); the connection is closed",
  "vmm.firecracker_api": "Firecracker answered an API request with an error (details.status, fault)",
  "vmm.firecracker_unreachable": "Firecracker's API socket did not answer (details.socket)",
  "vmm.snapshot_failed": "saving VM state failed (details.status)",
  "vmm.restore_failed": "loading VM state failed (details.status)",
  "vmm.snapshot_missing": "a snapshot file to restore from does not exist (details.path)",
  "vmm.stream_bad": "a QEMU migration stream the snapshot filter cannot parse (details.offset, and the field at fault)",
  "vmm.stream_truncated": "a QEMU migration stream ended in the middle of a record (details.offset)",
  "vmm.ksm_unavailable": "[vm] ksm asks for kernel samepage merging and this kernel has none (no /sys/kernel/mm/ksm)",
  "vmm.kernel_missing": "the guest kernel file does not exist (details.path)",
  "vmm.kernel_not_pvh": "the guest kernel has no PVH entry note (details.path)",
  "vmm.kernel_source_missing": "the kernel source tarball is not installed (details.path)",
  "vmm.kernel_config_mismatch": "the built kernel config lacks options the fragment asks for",
  "vmm.kernel_build_failed": "make failed while building the guest kernel (details: output tail)",
  "vmm.build_locked": "another process holds a build lock (kernel, tools drive, base template) past the wait (details.pid when known), or the wait could not run (details.reason)",
} as const satisfies ErrorTable;
/** A VmmError code. */
export type VmmErrorCode = keyof typeof VMM_ERRORS;

/** A failure of this subsystem: one of `VMM_ERRORS` as `code`, the offending values in `details`. */
export class VmmError extends AgentEnvError<VmmErrorCode> {}
