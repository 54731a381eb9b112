import { AgentEnvError } from "../errors.ts";

/**
 * Template store and base-image build failures. Stable codes: `template.not_found`,
 * `template.bad_manifest`, `template.build_failed`, `template.tool_missing`; `details` names the
 * template, path or command at fault.
 */
export class TemplateError extends AgentEnvError {}
