/** Console errors (terminal tickets, the terminal bridge); their statuses: src/api/status.ts. */
import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Every failure of the console's server side. Adding a code: see src/errors.ts. */
export const CONSOLE_ERRORS = {
  "console.sandbox_not_found": "a terminal asked for a sandbox this node does not hold (details.sandboxId)",
  "console.sandbox_not_running": "a terminal asked for a sandbox that is not running (details.sandboxId, state)",
  "console.too_many_terminals": "the node already bridges [console] max_terminals terminals (details.limit)",
  "console.bad_request": "a terminal request body that is not the expected JSON (details.field)",
  "console.envd_failed": "envd refused or broke the terminal's process stream (details.sandboxId, status)",
} as const satisfies ErrorTable;
/** A ConsoleError code. */
export type ConsoleErrorCode = keyof typeof CONSOLE_ERRORS;

/** A console failure with its stable code and the offending values. */
export class ConsoleError extends AgentEnvError<ConsoleErrorCode> {}
