/**
 * Cluster-wide reads the gateway answers by asking every node in parallel, each answer bounded
 * whole by request_timeout_ms: sandbox lists (v1 and v2 with filters and keyset pagination),
 * templates, snapshots, nodes. Nodes the scheduler reports UNHEALTHY are not asked. A node that
 * does not answer (or is not asked) is left out and named in the response header
 * `x-agentenv-unreachable-nodes` (a list keeps working while one node is down); when no node
 * answers, the list fails 502 naming them all. A node's 4xx (bad filter) is returned as is.
 *
 * v2 pagination across nodes: the nodes order sandboxes by (startedAt, sandboxID), descending
 * (E2B's default) unless `order=asc`, and their nextToken is an opaque keyset cursor over exactly that pair
 * (src/orchestrator: base64url of "startedAt:id"). The gateway sends the same query (limit L,
 * nextToken T) to every node, merges the answers in the same order, keeps the first L, and
 * issues the cursor of the last one kept when any node had more: a node then resumes after
 * that key, so no sandbox is skipped or repeated.
 */
import { type Static, type TSchema, Type as T } from "@sinclair/typebox";
import { encodeCursor } from "../../src/orchestrator/index.ts";
import { jsonSchema, type JsonSchema } from "../../src/util/json-check.ts";
import type { NodeRef } from "../../src/cluster/index.ts";
import { GatewayError } from "./errors.ts";
import { checkAnswer, getJson } from "./forward.ts";
import type { ClusterNodes } from "./scheduler-link.ts";

/** Header naming the nodes a fan-out could not reach. */
export const UNREACHABLE_HEADER = "x-agentenv-unreachable-nodes";

/** One node's answer in a fan-out, or its failure. */
export type NodeAnswer<T> = { node: NodeRef; ok: true; body: T; headers: Headers } | { node: NodeRef; ok: false; error: string };

/** Where a fan-out goes: the nodes, the key they take, the bounds on each whole answer (ms, bytes). */
export interface FanOut {
  nodes: ClusterNodes;
  apiKey: string;
  timeoutMs: number;
  maxBytes: number;
}

/** A list of records, each an object (fields the gateway does not read pass through as they are). */
export const RECORDS = jsonSchema(T.Array(T.Record(T.String(), T.Unknown())));

/** A sandbox list of a node (GET /sandboxes, /v2/sandboxes): the fields the merge orders by. */
const LISTED = jsonSchema(T.Array(T.Object({ sandboxID: T.String(), startedAt: T.String(), nodeID: T.Optional(T.String()) })));

/**
 * Ask every live node for `pathAndQuery` in parallel; unhealthy ones answer "not asked". A 2xx
 * answer must match `schema`: one that does not counts as the node failing (named in the error).
 * @throws ClientFault for a node's 4xx answer (a bad query).
 */
export async function fanOut<S extends TSchema>(f: FanOut, pathAndQuery: string, schema: JsonSchema<S>): Promise<NodeAnswer<Static<S>>[]> {
  const { apiKey, timeoutMs, maxBytes } = f;
  const skipped = f.nodes.unhealthy.map((node): NodeAnswer<Static<S>> => ({ node, ok: false, error: `node ${node.nodeId} (${node.endpoint}) is not asked: the scheduler reports it UNHEALTHY` }));
  const asked = await Promise.all(
    f.nodes.live.map(async (node): Promise<NodeAnswer<Static<S>>> => {
      try {
        const r = await getJson(node, pathAndQuery, apiKey, timeoutMs, maxBytes);
        if (r.status >= 400 && r.status < 500) throw new ClientFault(r.status, r.body);
        if (r.status >= 500) return { node, ok: false, error: `HTTP ${r.status}` };
        const body = checkAnswer(node, r.body, pathAndQuery, r.status, schema);
        return { node, ok: true, body, headers: r.headers };
      } catch (e) {
        if (e instanceof ClientFault) throw e;
        return { node, ok: false, error: e instanceof GatewayError ? e.message : String(e) };
      }
    }),
  );
  return [...asked, ...skipped];
}

/**
 * The answers, unless none succeeded.
 * @throws GatewayError node_unreachable naming every node when no node answered.
 */
export function someAnswered<T>(answers: NodeAnswer<T>[]): NodeAnswer<T>[] {
  if (answers.length === 0 || answers.some((a) => a.ok)) return answers;
  const failed = answers.filter((a): a is Extract<NodeAnswer<T>, { ok: false }> => !a.ok);
  throw new GatewayError("gateway.node_unreachable", `no node answered: ${failed.map((a) => a.error).join("; ")}`, { nodeIds: failed.map((a) => a.node.nodeId) });
}

/** A node refused the query itself (4xx): answered to the client unchanged (status and body). */
export class ClientFault extends Error {
  constructor(readonly status: number, readonly body: unknown) {
    super(`node answered ${status}`);
  }
}

function unreachable<T>(answers: NodeAnswer<T>[]): Record<string, string> {
  const down = answers.filter((a) => !a.ok).map((a) => a.node.nodeId);
  return down.length ? { [UNREACHABLE_HEADER]: down.join(",") } : {};
}

/**
 * GET /v2/sandboxes across nodes. `learn` is told which node holds each listed sandbox.
 * @param query the client's query string (URLSearchParams)
 */
export async function listV2(f: FanOut, query: URLSearchParams, learn: (id: string, n: NodeRef) => void): Promise<Response> {
  const limit = query.has("limit") ? Number(query.get("limit")) : 100;
  const answers = someAnswered(await fanOut(f, `/v2/sandboxes?${query.toString()}`, LISTED));
  const asc = query.get("order") === "asc";
  const items: { item: Static<typeof LISTED.schema>[number]; at: number }[] = [];
  let more = false;
  let running = 0;
  for (const a of answers) {
    if (!a.ok) continue;
    running += Number(a.headers.get("x-total-running") ?? 0);
    if (a.headers.get("x-next-token")) more = true;
    for (const item of a.body) {
      learn(item.sandboxID, a.node);
      // AgentENV's addition: the node holding it (the console's nodes page groups by it)
      items.push({ item: { ...item, nodeID: a.node.nodeId }, at: Date.parse(item.startedAt) });
    }
  }
  items.sort((x, y) => {
    const d = x.at - y.at || (x.item.sandboxID < y.item.sandboxID ? -1 : x.item.sandboxID > y.item.sandboxID ? 1 : 0);
    return asc ? d : -d;
  });
  if (items.length > limit) more = true;
  const page = items.slice(0, limit);
  const last = page[page.length - 1];
  const headers: Record<string, string> = { "x-total-running": String(running), ...unreachable(answers) };
  if (more && last) headers["x-next-token"] = encodeCursor({ startedAt: last.at, id: last.item.sandboxID });
  return Response.json(
    page.map((p) => p.item),
    { headers },
  );
}

/** GET /sandboxes (v1: running only, no pagination) across nodes, newest first. */
export async function listV1(f: FanOut, search: string, learn: (id: string, n: NodeRef) => void): Promise<Response> {
  const answers = someAnswered(await fanOut(f, `/sandboxes${search}`, LISTED));
  const all: Static<typeof LISTED.schema> = [];
  for (const a of answers) if (a.ok) for (const s of a.body) (learn(s.sandboxID, a.node), all.push(s));
  all.sort((x, y) => Date.parse(y.startedAt) - Date.parse(x.startedAt) || (x.sandboxID < y.sandboxID ? 1 : -1));
  return Response.json(all, { headers: unreachable(answers) });
}

/**
 * A list of records merged from every node, deduplicated by `key` (templates present on several
 * nodes appear once; numeric `spawnCount`/`buildCount` are summed).
 */
export async function mergedList(f: FanOut, pathAndQuery: string, key: string): Promise<{ response: Response; holders: Map<string, NodeRef[]> }> {
  const answers = someAnswered(await fanOut(f, pathAndQuery, RECORDS));
  const byKey = new Map<string, Record<string, unknown>>();
  const holders = new Map<string, NodeRef[]>();
  for (const a of answers) {
    if (!a.ok) continue;
    for (const rec of a.body) {
      const k = String(rec[key]);
      holders.set(k, [...(holders.get(k) ?? []), a.node]);
      const prev = byKey.get(k);
      if (!prev) byKey.set(k, { ...rec });
      else
        for (const f of ["spawnCount", "buildCount"]) {
          const [was, add] = [prev[f], rec[f]];
          if (typeof was === "number" && typeof add === "number") prev[f] = was + add;
        }
    }
  }
  return { response: Response.json([...byKey.values()], { headers: unreachable(answers) }), holders };
}
