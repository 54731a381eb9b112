import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Tools drive build and lookup failures. Adding a code: see src/errors.ts. */
export const TOOLS_ERRORS = {
  "tools.not_built": "no tools drive was built in this data directory (details.homePath); run `agentenv tools build`",
  "tools.missing_file": "a host file the tools drive carries is missing (details.path)",
  "tools.bad_elf": "a binary is not a 64-bit little-endian ELF or has no room for the new interpreter path (details.path)",
  "tools.build_failed": "a host tool of the build failed (details.cmd, output tail in the message)",
} as const satisfies ErrorTable;
/** A ToolsError code. */
export type ToolsErrorCode = keyof typeof TOOLS_ERRORS;

/** A failure of the tools drive subsystem: one of `TOOLS_ERRORS` as `code`, the offending values in `details`. */
export class ToolsError extends AgentEnvError<ToolsErrorCode> {}
