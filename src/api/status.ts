/**
 * The one table from error codes to the HTTP status the API answers with, and the error
 * responses built from it (E2B's body `{code, message, error_code}`). It covers every code
 * of every subsystem the API calls into (each subsystem's `*_ERRORS` table): a code answers 500
 * unless `NOT_500` names another status (add a code there when it is the request's fault).
 * test/api/status.test.ts walks every code through `toErrorResponse`. Statuses follow E2B's choices (../shared/docs/e2b-contract.md §2.3–2.4):
 * a fault of the request is 4xx, anything the node or a sandbox failed at is 5xx.
 * Not here: NODE_ERRORS (start-up, before the API serves) and envd's codes (envd answers its
 * own HTTP in the guest, src/envd/errors.ts).
 */
import { CONFIG_ERRORS, type ConfigErrorCode } from "../config/index.ts";
import { DB_ERRORS, type DbErrorCode } from "../db/index.ts";
import { FFI_ERRORS, type FfiErrorCode } from "../ffi/errors.ts";
import { NET_ERRORS, type NetErrorCode } from "../net/errors.ts";
import { ORCHESTRATOR_ERRORS, type OrchestratorErrorCode } from "../orchestrator/errors.ts";
import { DISK_ERRORS, type DiskErrorCode } from "../storage/errors.ts";
import { FUSE_ERRORS, type FuseErrorCode } from "../storage/fuse/errors.ts";
import { IMAGE_ERRORS, type ImageErrorCode } from "../image/errors.ts";
import { OVERLAYBD_ERRORS, type OverlaybdErrorCode } from "../storage/overlaybd/errors.ts";
import { UBLK_ERRORS, type UblkErrorCode } from "../storage/ublk/errors.ts";
import { TEMPLATE_ERRORS, type TemplateErrorCode } from "../template/errors.ts";
import { TOOLS_ERRORS, type ToolsErrorCode } from "../tools/errors.ts";
import { VMM_ERRORS, type VmmErrorCode } from "../vmm/errors.ts";
import { VOLUME_ERRORS, type VolumeErrorCode } from "../volume/errors.ts";
import { SNAPSHOT_ERRORS, type SnapshotErrorCode } from "../snapshot/errors.ts";
import { EVENTS_ERRORS, type EventsErrorCode } from "../events/errors.ts";
import { SECRETS_ERRORS, type SecretsErrorCode } from "../secrets/errors.ts";
import { logger } from "../observability/log.ts";
import { AgentEnvError } from "../errors.ts";
import { API_ERRORS, type ApiErrorCode } from "./errors.ts";
import { CONSOLE_ERRORS, type ConsoleErrorCode } from "../console/errors.ts";
import { errorMessage } from "../util/error.ts";

/** Every code an API response may carry. */
export type ErrorCode =
  | ApiErrorCode
  | OrchestratorErrorCode
  | ConfigErrorCode
  | DbErrorCode
  | FfiErrorCode
  | NetErrorCode
  | DiskErrorCode
  | FuseErrorCode
  | ImageErrorCode
  | OverlaybdErrorCode
  | UblkErrorCode
  | TemplateErrorCode
  | ToolsErrorCode
  | VmmErrorCode
  | VolumeErrorCode
  | SnapshotErrorCode
  | ConsoleErrorCode
  | EventsErrorCode
  | SecretsErrorCode;

/** Every subsystem code table this module maps (for tests and documentation). */
export const ERROR_TABLES = {
  api: API_ERRORS,
  orchestrator: ORCHESTRATOR_ERRORS,
  config: CONFIG_ERRORS,
  db: DB_ERRORS,
  ffi: FFI_ERRORS,
  net: NET_ERRORS,
  disk: DISK_ERRORS,
  fuse: FUSE_ERRORS,
  image: IMAGE_ERRORS,
  overlaybd: OVERLAYBD_ERRORS,
  ublk: UBLK_ERRORS,
  template: TEMPLATE_ERRORS,
  tools: TOOLS_ERRORS,
  vmm: VMM_ERRORS,
  volume: VOLUME_ERRORS,
  snapshot: SNAPSHOT_ERRORS,
  console: CONSOLE_ERRORS,
  events: EVENTS_ERRORS,
  secrets: SECRETS_ERRORS,
} as const;

/** Codes whose status is not 500: faults of the request, and refusals a client may retry. */
const NOT_500 = {
  "api.validation": 400,
  "api.parse": 400,
  "api.not_json": 400,
  "api.no_route": 404,
  "api.bad_limit": 400,
  "api.bad_metadata": 400,
  "api.bad_state": 400,
  "api.bad_time": 400,
  "api.bad_time_range": 400,
  "api.bad_sandbox_ids": 400,
  "api.unsupported": 400,
  "api.unknown_field": 400,
  "api.bad_depth": 400,
  "api.unauthorized": 401,
  "api.body_too_large": 413,
  "api.node_not_found": 404,
  "api.starting": 503,
  "orchestrator.not_found": 404,
  "orchestrator.template_not_found": 404,
  "orchestrator.conflict": 409,
  "orchestrator.bad_request": 400,
  "orchestrator.capacity": 429,
  "orchestrator.busy": 409,
  "orchestrator.shutting_down": 503,
  "orchestrator.volume_not_found": 404,
  "orchestrator.volume_exists": 409,
  "orchestrator.volume_in_use": 409,
  "orchestrator.volume_busy": 409,
  "volume.bad_path": 400,
  "volume.path_not_found": 404,
  "volume.exists": 409,
  "volume.not_a_directory": 400,
  "volume.is_a_directory": 400,
  "volume.too_many_entries": 400,
  "volume.read_only": 409,
  "net.bad_policy": 400,
  "image.bad_reference": 400,
  "image.not_found": 400,
  "net.capacity": 503,
  "template.not_found": 404,
  "template.bad_name": 400,
  "template.build_not_found": 404,
  "template.not_ready": 400,
  "template.bad_request": 400,
  "template.read_only": 400,
  "template.conflict": 409,
  "template.files_missing": 400,
  "template.upload_denied": 403,
  "template.upload_too_large": 413,
  "snapshot.not_found": 404,
  "snapshot.bad_request": 400,
  "snapshot.in_use": 409,
  "snapshot.remote_failed": 503,
  "console.sandbox_not_found": 404,
  "console.sandbox_not_running": 409,
  "console.too_many_terminals": 429,
  "console.bad_request": 400,
  "events.not_found": 404,
  "events.bad_request": 400,
  "events.webhook_not_found": 404,
  "events.webhook_limit": 429,
  "secrets.bad_request": 400,
  "secrets.not_found": 404,
  "secrets.conflict": 409,
  "secrets.remote_store": 403,
  "secrets.remote_failed": 503,
  "secrets.store_failed": 503,
} as const satisfies Partial<Record<ErrorCode, number>>;

/** HTTP status of every code an API response may carry: `NOT_500`, else 500. */
export const ERROR_STATUS: Readonly<Record<ErrorCode, number>> = Object.fromEntries(
  Object.values(ERROR_TABLES).flatMap((t) => Object.keys(t).map((c) => [c, (NOT_500 as Record<string, number>)[c] ?? 500])),
) as Record<ErrorCode, number>;

/** The status of `code`; undefined for a code no table lists. */
export function statusOf(code: ErrorCode): number;
export function statusOf(code: string): number | undefined;
export function statusOf(code: string): number | undefined {
  return (ERROR_STATUS as Record<string, number>)[code];
}

const log = logger("api");

/**
 * A JSON error response as E2B sends it (the SDK reads `body.code`), with the status of `errorCode`.
 * A 429 carries `Retry-After: 1`: the SDKs retry it by themselves (e2b-contract.md §2.2).
 */
export function errorResponse(errorCode: ErrorCode, message: string, headers: Record<string, string> = {}): Response {
  return jsonError(statusOf(errorCode), errorCode, message, headers);
}

function jsonError(status: number, errorCode: string, message: string, headers: Record<string, string> = {}): Response {
  const h = status === 429 ? { "retry-after": "1", ...headers } : headers;
  return Response.json({ code: status, message, error_code: errorCode }, { status, headers: h });
}

/**
 * Map any thrown value to an error response: a typed error answers the status of its code
 * (500 for a code outside `ERROR_STATUS`, e.g. envd's); anything else is a 500 `api.internal`
 * with its message. Every 5xx is logged with the error and its cause chain (which step of a
 * start, pause or resume failed).
 */
export function toErrorResponse(e: unknown): Response {
  const code = e instanceof AgentEnvError ? e.code : "api.internal";
  const status = statusOf(code) ?? 500;
  if (status >= 500) log.error({ err: e, code, details: (e as AgentEnvError)?.details }, `API answered ${status}: ${errorMessage(e)}`);
  return jsonError(status, code, e instanceof Error ? e.message : String(e));
}
