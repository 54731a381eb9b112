/**
 * Forwarding one HTTP request to a node: streamed both ways, hop-by-hop headers dropped, the
 * client's abort passed on. Bounds, as the node's sandbox proxy has them (src/api/proxy.ts, src/api/upstream.ts):
 * `timeoutMs` on connecting (until the node pulls the streamed request body, or for a request
 * without a streamed body until its response headers arrive: `answerMs` when given); while a streamed body moves,
 * `idleTimeoutMs` between its chunks (it may stream for as long as it keeps moving); from its end
 * to the response headers `afterBodyMs` (default `timeoutMs`); then the response body streams
 * unbounded. A node that does not answer is a GatewayError
 * `gateway.node_unreachable` naming it, with how it failed in `details.failure`; a node's own
 * answer (any status) is passed through. `getJson` (the reads the gateway merges) bounds the
 * whole answer, body included, in time and in bytes.
 */
import type { Static, TSchema } from "@sinclair/typebox";
import { upstreamFailure, upstreamFailureKind, Watchdog, watchedBody, type UpstreamFailureKind } from "../../src/api/upstream.ts";
import { describeProblem, type JsonSchema } from "../../src/util/json-check.ts";
import { readCapped, type CappedBody } from "../../src/util/read-capped.ts";
import { GATEWAY_ONLY_HEADERS } from "../../src/cluster/index.ts";
import { GatewayError } from "./errors.ts";
import type { NodeRef } from "../../src/cluster/index.ts";

/** A signal that never aborts (a read bounded by its caller's own signal). */
const NEVER = new AbortController().signal;

const HOP = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host", "proxy-authorization", "proxy-authenticate", "content-length"];

/** Response header naming the node that answered a forwarded request. */
export const NODE_HEADER = "x-agentenv-node-id";

/** Options of one forwarded request. */
export interface ForwardOptions {
  /** Path + query on the node. */
  pathAndQuery: string;
  /** Bound on connecting (a request without a streamed body: connect + response headers), ms. */
  timeoutMs: number;
  /**
   * A streamed request body's longest pause between chunks, ms; default `timeoutMs`.
   */
  idleTimeoutMs?: number;
  /** Bound from a streamed request body's end to the response headers, ms; default `timeoutMs`. */
  afterBodyMs?: number;
  /** Bound on a request without a streamed body: connect + response headers, ms; default `timeoutMs`. */
  answerMs?: number;
  /** Headers to set (e.g. the node key, routing headers). */
  set?: Record<string, string>;
  /** Request body to send instead of the client's stream (already read). */
  body?: Uint8Array | null;
  /** The client's address (x-forwarded-for). */
  clientIp?: string | null;
}

/** How a node failed a request (`details.failure` of `gateway.node_unreachable`). */
export type NodeFailure = UpstreamFailureKind | "bad_answer";

/** `details` of a `gateway.node_unreachable` error. */
export interface NodeFailureDetails {
  nodeId: string;
  failure: NodeFailure;
}

/** The failure kind of a `gateway.node_unreachable` error, or null for any other value. */
export function nodeFailureOf(e: unknown): NodeFailure | null {
  return e instanceof GatewayError && e.code === "gateway.node_unreachable" ? ((e.details as Partial<NodeFailureDetails>).failure ?? null) : null;
}

/** Whether a failure means the request never reached the node (it may go to another one). */
export function neverReached(f: NodeFailure | null): boolean {
  return f === "refused" || f === "unreachable";
}

function unreachable(node: NodeRef, why: string, failure: NodeFailure, cut = false): GatewayError {
  const details: NodeFailureDetails = { nodeId: node.nodeId, failure };
  const what = cut ? `the request to node ${node.nodeId} (${node.endpoint}) was cut` : `node ${node.nodeId} (${node.endpoint}) is unreachable`;
  return new GatewayError("gateway.node_unreachable", `${what}: ${why}`, { ...details });
}

/** Response headers without hop-by-hop ones. */
export function passHeaders(h: Headers): Headers {
  const out = new Headers(h);
  for (const n of HOP) if (n !== "content-length") out.delete(n);
  return out;
}

/**
 * Send `req` to `node`. Aborting `req.signal` aborts the upstream request, its body included.
 * @throws GatewayError gateway.node_unreachable (connection refused/reset, no headers in time).
 */
export async function forwardToNode(req: Request, node: NodeRef, o: ForwardOptions): Promise<Response> {
  const headers = new Headers(req.headers);
  for (const n of HOP) headers.delete(n);
  // a client must not say what only the gateway may (a take-over of another node's sandbox)
  for (const n of GATEWAY_ONLY_HEADERS) headers.delete(n);
  for (const [k, v] of Object.entries(o.set ?? {})) headers.set(k, v);
  if (o.clientIp) headers.set("x-forwarded-for", o.clientIp);
  const ctl = new AbortController();
  const onAbort = () => ctl.abort(req.signal.reason);
  req.signal.addEventListener("abort", onAbort, { once: true });
  const hasBody = req.method !== "GET" && req.method !== "HEAD";
  const streamed = hasBody && o.body === undefined && req.body !== null;
  const dog = new Watchdog(ctl);
  const firstMs = streamed ? o.timeoutMs : (o.answerMs ?? o.timeoutMs);
  dog.arm(firstMs, streamed ? `not connected within ${firstMs} ms` : `no answer within ${firstMs} ms`);
  const idleMs = o.idleTimeoutMs ?? o.timeoutMs;
  const body = streamed ? watchedBody(req.body!, dog, idleMs, o.afterBodyMs ?? o.timeoutMs) : undefined;
  let res: Response;
  try {
    res = await fetch(node.endpoint + o.pathAndQuery, {
      method: req.method,
      headers,
      body: hasBody ? (o.body !== undefined ? o.body : body) : undefined,
      redirect: "manual",
      decompress: false,
      duplex: "half",
      signal: ctl.signal,
    } as RequestInit);
  } catch (e) {
    req.signal.removeEventListener("abort", onAbort);
    throw unreachable(node, upstreamFailure(e, ctl.signal), upstreamFailureKind(e, ctl.signal), dog.bodyPulled);
  } finally {
    dog.clear();
  }
  const h = passHeaders(res.headers);
  h.set(NODE_HEADER, node.nodeId);
  return new Response(res.body, { status: res.status, statusText: res.statusText, headers: h });
}

/**
 * The whole body of a node's answer, at most `maxBytes` (an answer the gateway reads to merge or
 * rewrite it, rather than streaming it through).
 * @throws GatewayError node_unreachable (`bad_answer`) for a longer body; as `upstreamFailure`
 *   when it breaks off (`signal` tells a deadline from a reset).
 */
export async function readAnswer(node: NodeRef, res: Response, what: string, maxBytes: number, signal: AbortSignal = NEVER): Promise<Uint8Array> {
  let b: CappedBody;
  try {
    b = await readCapped(res.body, maxBytes);
  } catch (e) {
    throw unreachable(node, `its answer to ${what} broke off: ${upstreamFailure(e, signal)}`, upstreamFailureKind(e, signal));
  }
  if (b.truncated) throw unreachable(node, `its answer to ${what} exceeds ${maxBytes} bytes ([gateway] max_answer_bytes)`, "bad_answer");
  return b.bytes;
}

/**
 * A node's answer body parsed as JSON.
 * @throws GatewayError node_unreachable (`bad_answer`) when it is not JSON.
 */
export function parseAnswer(node: NodeRef, bytes: Uint8Array, what: string, status: number): unknown {
  try {
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    throw unreachable(node, `it answered ${what} with a body that is not JSON (HTTP ${status})`, "bad_answer");
  }
}

/**
 * A node's parsed answer checked against `schema` (the shape the gateway reads from it).
 * @throws GatewayError node_unreachable (`bad_answer`) naming the field at fault.
 */
export function checkAnswer<S extends TSchema>(node: NodeRef, value: unknown, what: string, status: number, schema: JsonSchema<S>): Static<S> {
  const r = schema.check(value);
  if (!r.ok) throw unreachable(node, `it answered ${what} with a body the API does not return (HTTP ${status}): ${describeProblem(r.problem)}`, "bad_answer");
  return r.value;
}

/**
 * GET a JSON document from a node (fan-out reads): `callJson` without a body.
 */
export function getJson(node: NodeRef, pathAndQuery: string, apiKey: string, timeoutMs: number, maxBytes: number): Promise<{ body: unknown; headers: Headers; status: number }> {
  return callJson(node, "GET", pathAndQuery, undefined, apiKey, timeoutMs, maxBytes);
}

/**
 * `method` `pathAndQuery` on a node with a JSON body (none when undefined), the whole answer
 * within `timeoutMs` and at most `maxBytes`; an empty answer body reads as null.
 * @returns the parsed body (unchecked: each caller checks the shape it reads), headers, status
 * @throws GatewayError node_unreachable (no answer, a body cut, not finished in time, longer
 *   than `maxBytes`, not JSON).
 */
export async function callJson(node: NodeRef, method: string, pathAndQuery: string, body: unknown, apiKey: string, timeoutMs: number, maxBytes: number): Promise<{ body: unknown; headers: Headers; status: number }> {
  const deadline = new AbortController();
  const timer = setTimeout(() => deadline.abort(new Error(`no complete answer within ${timeoutMs} ms`)), timeoutMs);
  try {
    const headers: Record<string, string> = { "x-api-key": apiKey, accept: "application/json", ...(body === undefined ? {} : { "content-type": "application/json" }) };
    const req = new Request("http://gateway.invalid" + pathAndQuery, { method, headers, signal: deadline.signal });
    const sent = body === undefined ? undefined : new TextEncoder().encode(JSON.stringify(body));
    const res = await forwardToNode(req, node, { pathAndQuery, timeoutMs, ...(sent ? { body: sent } : {}) });
    const bytes = await readAnswer(node, res, pathAndQuery, maxBytes, deadline.signal);
    return { body: bytes.length === 0 ? null : parseAnswer(node, bytes, pathAndQuery, res.status), headers: res.headers, status: res.status };
  } finally {
    clearTimeout(timer);
  }
}
