/**
 * Base class of every typed error in AgentENV. Each subsystem defines its own subclass
 * (`OverlaybdError`, `VmmError`, `NetError`, ...) over its own union of stable codes, and the
 * offending values in `details` (file, offset, sandbox id, ...).
 *
 * Adding a code (one line): add it with a one-line meaning to the subsystem's code table, e.g.
 * `NET_ERRORS` in src/net/errors.ts (`"net.new_thing": "what went wrong (details.x)"`); the code
 * union is derived from the table, so the constructor only accepts listed codes. The API answers
 * it with status 500 unless it is listed in `NOT_500` (src/api/status.ts, for a fault of the
 * request); test/api/status.test.ts walks every code of every table through the API's mapping.
 * A new subsystem's table goes into `ERROR_TABLES` there too: the same test fails for any
 * `export const *_ERRORS` table under src/ that the API does not map.
 */
export class AgentEnvError<C extends string = string> extends Error {
  /** Stable identifier such as `overlaybd.bad_magic`; never reworded once published. */
  readonly code: C;
  /** Plain JSON-able values naming what failed and with which input. */
  readonly details: Record<string, unknown>;

  constructor(code: C, message: string, details: Record<string, unknown> = {}, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.details = details;
  }
}

/** A subsystem's code table: each code with a one-line meaning (what failed, which details). */
export type ErrorTable = Readonly<Record<string, string>>;
