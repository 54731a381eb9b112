/** API-layer errors; their statuses and the error responses: ./status.ts. */
import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Errors the API layer raises itself (auth, request shape, routing). Adding a code: see src/errors.ts. */
export const API_ERRORS = {
  "api.validation": "the request does not match the route's schema",
  "api.parse": "the request body is not valid JSON",
  "api.not_json": "a request body on a JSON route sent without a JSON content type (details.contentType)",
  "api.no_route": "no route for this method and path",
  "api.bad_limit": "a list `limit` outside 1..100",
  "api.bad_metadata": "a metadata filter that is not key=value pairs or is badly percent-encoded",
  "api.bad_state": "a list `state` other than running or paused",
  "api.bad_time": "a time parameter that is not RFC 3339",
  "api.bad_time_range": "a metrics range whose end is before its start (details.start, end)",
  "api.bad_sandbox_ids": "sandbox_ids empty or naming more than 100 ids",
  "api.unsupported": "an E2B field this node does not implement (details.field)",
  "api.unknown_field": "a body field its route does not know, refused while [api] strict_bodies is true (details.field, route)",
  "api.bad_depth": "a volume listing depth outside 1..100 (details.depth)",
  "api.unauthorized": "a missing or wrong X-API-Key",
  "api.body_too_large": "a request body above [api] max_body_bytes",
  "api.node_not_found": "a node id other than this node's",
  "api.key_unreadable": "the API key file cannot be read or is empty (details.path)",
  "api.starting": "the node is still starting",
  "api.internal": "an unexpected failure inside the node (a bug; logged with its cause)",
} as const satisfies ErrorTable;
/** An ApiError code. */
export type ApiErrorCode = keyof typeof API_ERRORS;

/** Errors raised by the API layer itself (auth, request shape). Its status: `ERROR_STATUS[code]`. */
export class ApiError extends AgentEnvError<ApiErrorCode> {}
