/**
 * Base class of every typed error in AgentENV. Each subsystem defines its own subclass
 * (`OverlaybdError`, `VmmError`, `NetError`, ...) with a stable machine-readable `code`
 * and the offending values in `details` (file, offset, sandbox id, ...).
 */
export class AgentEnvError extends Error {
  /** Stable identifier such as `overlaybd.bad_magic`; never reworded once published. */
  readonly code: string;
  /** Plain JSON-able values naming what failed and with which input. */
  readonly details: Record<string, unknown>;

  constructor(code: string, message: string, details: Record<string, unknown> = {}, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.details = details;
  }
}
