import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Template store and base-image build failures. Adding a code: see src/errors.ts. */
export const TEMPLATE_ERRORS = {
  "template.not_found": "no template of that name (details.template)",
  "template.bad_name": "a template name outside [a-z0-9._-] (details.name)",
  "template.bad_manifest": "a template's manifest is unreadable or invalid (details.path)",
  "template.build_failed": "a build step failed (details.cmd, output tail)",
  "template.tool_missing": "a host tool the build needs is not installed (details.tool)",
  "template.no_mirror": "no Debian mirror configured or found in the host's apt sources",
} as const satisfies ErrorTable;
/** A TemplateError code. */
export type TemplateErrorCode = keyof typeof TEMPLATE_ERRORS;

/** A failure of this subsystem: one of `TEMPLATE_ERRORS` as `code`, the offending values in `details`. */
export class TemplateError extends AgentEnvError<TemplateErrorCode> {}
