import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Template store, catalog and build failures. Adding a code: see src/errors.ts. */
export const TEMPLATE_ERRORS = {
  "template.not_found": "no template of that name or id (details.template)",
  "template.bad_name": "a template name or tag outside the allowed grammar (details.name / tag)",
  "template.bad_manifest": "a template's manifest is unreadable or invalid (details.path)",
  "template.build_failed": "a build step failed (details.cmd, output tail)",
  "template.tool_missing": "a host tool the build needs is not installed (details.tool)",
  "template.no_mirror": "no Debian mirror configured or found in the host's apt sources",
  "template.build_not_found": "no build of that id in the template (details.templateID, buildID)",
  "template.not_ready": "the template (or the tag named) has no ready build (details.template)",
  "template.bad_request": "a build request or step the node refuses (details.field / step)",
  "template.read_only": "a build-base template cannot be changed through the API (details.template)",
  "template.conflict": "the build was already started, or a build of the template is running (details.buildID)",
  "template.step_failed": "a build step exited non-zero (details.step, exitCode; output tail in the message)",
  "template.unsupported_step": "a step type (Dockerfile instruction) the builder does not run (details.step, type)",
  "template.ready_timeout": "the ready command did not pass within [template_build] ready_timeout_ms (details.step)",
  "template.files_missing": "a COPY step names files that were never uploaded (details.filesHash)",
  "template.upload_denied": "an upload URL with a wrong or expired token (details.hash)",
  "template.upload_too_large": "an upload above [template_build] max_upload_bytes (details.maxBytes)",
  "template.upload_failed": "writing an upload to disk failed (details.hash)",
  "template.snapshot_failed": "booting a template once and committing its snapshot failed (details.name, step, console tail)",
} as const satisfies ErrorTable;
/** A TemplateError code. */
export type TemplateErrorCode = keyof typeof TEMPLATE_ERRORS;

/** A failure of this subsystem: one of `TEMPLATE_ERRORS` as `code`, the offending values in `details`. */
export class TemplateError extends AgentEnvError<TemplateErrorCode> {}
