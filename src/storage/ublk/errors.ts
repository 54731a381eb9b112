import { AgentEnvError, type ErrorTable } from "../../errors.ts";

/** Every failure of the ublk subsystem. Adding a code: see src/errors.ts. */
export const UBLK_ERRORS = {
  "ublk.unavailable": "no /dev/ublk-control, or the kernel refuses io_uring or the control commands",
  "ublk.control_failed": "a control command failed (details.command, devId, errno)",
  "ublk.timeout": "a control command or a wait took longer than its bound (details.timeoutMs)",
  "ublk.bad_config": "bad device options (queues, depth, sizes, block shifts; details.field)",
  "ublk.not_found": "no ublk device with that id (details.devId)",
  "ublk.busy": "the device is served by another running process (details.devId, pid)",
  "ublk.bad_state": "an operation the device's state does not allow, e.g. binding a device that is not pre-created (details.devId, state)",
  "ublk.not_recoverable": "no user recovery on the device, a live server, a stopped device or a size mismatch (details.devId)",
  "ublk.queue_failed": "a queue thread failed to start or stopped serving (details.devId, queue)",
  "ublk.target_failed": "a target file cannot be opened or has the wrong size or format (details.file)",
  "ublk.out_of_range": "I/O beyond the target's end (details.offset, length, size)",
  "ublk.io_failed": "reading or writing a target's file failed (details.file, offset)",
} as const satisfies ErrorTable;
/** A UblkError code. */
export type UblkErrorCode = keyof typeof UBLK_ERRORS;

/** A failure of this subsystem: one of `UBLK_ERRORS` as `code`, the offending values in `details`. */
export class UblkError extends AgentEnvError<UblkErrorCode> {}
