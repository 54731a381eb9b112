import { AgentEnvError } from "../../errors.ts";

/**
 * The one error type of the overlaybd subsystem. `code` is stable (`overlaybd.bad_magic`,
 * `overlaybd.crc_mismatch`, ...); `details` names the file and the byte offset at fault
 * whenever one exists.
 */
export class OverlaybdError extends AgentEnvError {}

/** Shorthand used across the module: throw a typed error with file and offset details. */
export function fail(code: string, message: string, details: Record<string, unknown> = {}): never {
  const where = details.file !== undefined ? ` (${details.file}${details.offset !== undefined ? ` @${details.offset}` : ""})` : "";
  throw new OverlaybdError(`overlaybd.${code}`, message + where, details);
}
