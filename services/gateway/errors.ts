/**
 * The gateway's error codes, each with its HTTP status, and its error responses (E2B's body
 * `{code, message, error_code}`; the SDKs read `code`). Data-plane failures answer the E2B edge
 * proxy's shape `{sandboxId, message, code: 502}` instead (the SDKs treat a 502 from envd as
 * "sandbox gone").
 */
import { AgentEnvError, type ErrorTable } from "../../src/errors.ts";
import { errorMessage } from "../../src/util/error.ts";

export const GATEWAY_ERRORS = {
  "gateway.unauthorized": "a missing or wrong X-API-Key",
  "gateway.no_route": "no gateway route for this method and path",
  "gateway.bad_request": "a request the gateway cannot read (malformed JSON body, bad routing header)",
  "gateway.body_too_large": "a control-plane body above [gateway] max_body_bytes",
  "gateway.sandbox_not_found": "no node holds this sandbox (scheduler binding absent)",
  "gateway.node_not_found": "no such node (neither discovered nor reporting)",
  "gateway.scheduler_unavailable": "the scheduler did not answer and the gateway's cache cannot serve the request",
  "gateway.no_nodes": "the scheduler knows no node to place or list on",
  "gateway.node_unreachable": "the node holding the sandbox (details.nodeId) did not answer",
  "gateway.bad_state": "a file in the gateway's data directory (its webhook registry, details.path) that cannot be read",
  "gateway.internal": "an unexpected failure inside the gateway (a bug; logged)",
} as const satisfies ErrorTable;
export type GatewayErrorCode = keyof typeof GATEWAY_ERRORS;

/** HTTP status of each code. */
export const GATEWAY_STATUS: Readonly<Record<GatewayErrorCode, number>> = {
  "gateway.unauthorized": 401,
  "gateway.no_route": 404,
  "gateway.bad_request": 400,
  "gateway.body_too_large": 413,
  "gateway.sandbox_not_found": 404,
  "gateway.node_not_found": 404,
  "gateway.scheduler_unavailable": 503,
  "gateway.no_nodes": 503,
  "gateway.node_unreachable": 502,
  "gateway.bad_state": 500,
  "gateway.internal": 500,
};

/** A failure the gateway answers itself. */
export class GatewayError extends AgentEnvError<GatewayErrorCode> {}

/** Header on every error the gateway answers by itself (absent: the node's own answer). */
export const GATEWAY_SOURCE = "x-agentenv-error-source";

/** The JSON error response of `code`. */
export function gatewayError(code: GatewayErrorCode, message: string, extra: Record<string, unknown> = {}): Response {
  const status = GATEWAY_STATUS[code];
  return Response.json({ code: status, message, error_code: code, ...extra }, { status, headers: { [GATEWAY_SOURCE]: "gateway", ...(status === 503 ? { "retry-after": "1" } : {}) } });
}

/** Map a thrown value to a response (GatewayError by its code, anything else 500). */
export function toGatewayResponse(e: unknown): Response {
  if (e instanceof GatewayError) return gatewayError(e.code, e.message, e.details);
  return gatewayError("gateway.internal", `the gateway failed: ${errorMessage(e)}`);
}
