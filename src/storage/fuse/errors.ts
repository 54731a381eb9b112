import { AgentEnvError } from "../../errors.ts";

/**
 * Errors of the FUSE export. Codes: `fuse.open_device` (cannot open /dev/fuse), `fuse.mount`
 * (mount(2) refused; details.errno), `fuse.bad_options` (invalid export options),
 * `fuse.closed` (the export was already closed), `fuse.connection_lost` (the kernel ended the
 * connection while serving).
 */
export class FuseError extends AgentEnvError {}
