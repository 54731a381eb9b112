/**
 * The gateway's `/events/...` routes (lifecycle events and webhooks, docs/events.md). Each node
 * records the events of its own sandboxes and delivers them to its own copy of each webhook, so:
 * - a webhook registered here is registered on every live node under one id (the gateway picks
 *   a UUID and PUTs the registration to each node; PATCH and DELETE go to every node too), and
 *   kept in the gateway's registry (webhook-registry.ts): a node that did not answer (named in
 *   `x-agentenv-unreachable-nodes`), joins later or comes back is brought up to date by the
 *   webhook sync (webhook-sync.ts), so one registration reaches every node's events;
 * - `GET /events/sandboxes/{id}` is the answer of the node that knows the sandbox;
 * - `GET /events/sandboxes` merges every node's answer by time: with E2B's `offset`/`limit`, each
 *   node is asked for its first offset + limit events (at most MAX_MERGED); with `cursor` (the
 *   feed), the cursor holds each node's own, and a page holds up to `limit` events per node;
 * - webhook reads: the list is the union of the nodes' (by id); one webhook and its delivery log
 *   are the nodes' answers merged (each node logs the deliveries of its own events).
 */
import { type Static, type TSchema, Type as T } from "@sinclair/typebox";
import { errorMessage } from "../../src/util/error.ts";
import { jsonSchema, type JsonSchema } from "../../src/util/json-check.ts";
import type { NodeRef } from "../../src/cluster/index.ts";
import { ClientFault, fanOut, someAnswered, UNREACHABLE_HEADER, type FanOut, type NodeAnswer } from "./aggregate.ts";
import { GatewayError } from "./errors.ts";
import { callJson, checkAnswer } from "./forward.ts";
import type { WebhookRegistry } from "./webhook-registry.ts";
import type { WebhookSync } from "./webhook-sync.ts";

/** Most events the gateway merges for one offset/limit listing (offset + limit). */
export const MAX_MERGED = 1000;

/** An object whose other fields pass through unread. */
const open = <P extends Parameters<typeof T.Object>[0]>(p: P) => T.Intersect([T.Record(T.String(), T.Unknown()), T.Object(p)]);

/** What the gateway reads of the nodes' answers (every other field passes through). */
const EVENTS = jsonSchema(T.Array(open({ id: T.String(), timestamp: T.String() })));
const WEBHOOKS = jsonSchema(T.Array(open({ id: T.String(), createdAt: T.String() })));
const DELIVERIES = jsonSchema(open({ data: T.Array(open({ eventId: T.String(), attempts: T.Array(open({ timestamp: T.String() })) })), nextCursor: T.Union([T.String(), T.Null()]) }));

type Event = Static<typeof EVENTS.schema>[number];
type Deliveries = Static<typeof DELIVERIES.schema>;

const byTime = (asc: boolean) => (a: Event, b: Event) => {
  const d = Date.parse(a.timestamp) - Date.parse(b.timestamp) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
  return asc ? d : -d;
};

function unreachable<T>(answers: NodeAnswer<T>[]): Record<string, string> {
  const down = answers.filter((a) => !a.ok).map((a) => a.node.nodeId);
  return down.length ? { [UNREACHABLE_HEADER]: down.join(",") } : {};
}

/** Per-node cursors as one opaque token, and back. @throws GatewayError bad_request for a token not made here */
export function encodeCursors(c: Record<string, string>): string {
  return Buffer.from(JSON.stringify(c)).toString("base64url");
}
export function decodeCursors(token: string): Record<string, string> {
  try {
    const v = JSON.parse(Buffer.from(token, "base64url").toString()) as unknown;
    if (typeof v === "object" && v !== null && !Array.isArray(v) && Object.values(v).every((x) => typeof x === "string")) return v as Record<string, string>;
  } catch {
    // reported below
  }
  throw new GatewayError("gateway.bad_request", `cursor ${JSON.stringify(token)} was not handed out by this gateway (x-next-cursor)`);
}

/** The `/events/...` routes over the cluster's nodes. */
export class GatewayEvents {
  /**
   * @param fan the live nodes, their key and the bound on each answer
   * @param body a request's JSON body, read within the gateway's body bound
   * @param hooks the webhook registry and its sync to the nodes (null: writes reach the live nodes only)
   * @param uuid a new webhook id
   */
  constructor(
    private readonly fan: () => Promise<FanOut>,
    private readonly body: (req: Request) => Promise<unknown>,
    private readonly hooks: { registry: WebhookRegistry; sync: WebhookSync } | null = null,
    private readonly uuid: () => string = () => crypto.randomUUID(),
  ) {}

  /** Answer `req` (path under /events/), or null when no route matches. */
  async handle(req: Request, url: URL): Promise<Response | null> {
    const path = url.pathname;
    const m = req.method;
    if (m === "GET" && path === "/events/sandboxes") return this.list(url.searchParams);
    const one = /^\/events\/sandboxes\/([^/]+)$/.exec(path);
    if (m === "GET" && one) return this.firstKnowing(path + url.search);
    if (path === "/events/webhooks") {
      if (m === "GET") return this.webhooks();
      if (m === "POST") return this.write("PUT", this.uuid(), (await this.body(req)) as Record<string, unknown>, 201);
    }
    const hook = /^\/events\/webhooks\/([0-9a-fA-F-]{36})(\/deliveries)?$/.exec(path);
    if (hook && hook[2] && m === "GET") return this.deliveries(hook[1]!, url.searchParams);
    if (hook && !hook[2]) {
      if (m === "GET") return this.firstKnowing(path);
      if (m === "PUT" || m === "PATCH" || m === "DELETE") return this.write(m, hook[1]!, m === "DELETE" ? undefined : ((await this.body(req)) as Record<string, unknown>));
    }
    return null;
  }

  /**
   * A webhook write (`method` PUT, PATCH or DELETE of webhook `id`) on every live node, then, when
   * the nodes took it, into the registry (so later nodes get it) with the nodes that took it
   * noted; one at a time with the sync's rounds (webhook-sync.ts).
   */
  private write(method: "PUT" | "PATCH" | "DELETE", id: string, b: Record<string, unknown> | undefined, created?: number): Promise<Response> {
    const path = `/events/webhooks/${id}`;
    if (!this.hooks) return this.everywhere(method, path, b, created).then((r) => r.response);
    const { registry, sync } = this.hooks;
    return sync.exclusive(async () => {
      const { response, took } = await this.everywhere(method, path, b, created);
      let version: number | undefined;
      if (method === "DELETE") {
        // gone from every node that answered, or never on them: nodes away get the delete later
        if (response.ok || (response.status === 404 && registry.has(id))) version = registry.remove(id).version;
      } else if (response.ok) {
        version = method === "PUT" ? registry.put(id, b!).version : registry.patch(id, b!)?.version;
      }
      if (version !== undefined) for (const n of took) sync.took(n, id, version);
      return response;
    });
  }

  /** E2B listing (offset/limit merged by time) or the feed (per-node cursors). */
  private async list(q: URLSearchParams): Promise<Response> {
    const f = await this.fan();
    const asc = q.get("orderAsc") === "true";
    if (q.has("cursor")) {
      const cursors = q.get("cursor") ? decodeCursors(q.get("cursor")!) : {};
      const answers = someAnswered(await this.each(f, EVENTS, (n) => withParam(q, "cursor", cursors[n.nodeId] ?? "")));
      const next = { ...cursors };
      const out: Event[] = [];
      for (const a of answers) {
        if (!a.ok) continue;
        out.push(...a.body);
        next[a.node.nodeId] = a.headers.get("x-next-cursor") ?? next[a.node.nodeId] ?? "";
      }
      return Response.json(out.sort(byTime(true)), { headers: { "x-next-cursor": encodeCursors(next), ...unreachable(answers) } });
    }
    const offset = Number(q.get("offset") ?? 0);
    const limit = Number(q.get("limit") ?? 10);
    if (!Number.isInteger(offset) || !Number.isInteger(limit) || offset < 0 || limit < 1 || limit > 100 || offset + limit > MAX_MERGED) {
      throw new ClientFault(400, { code: 400, message: `offset and limit must be integers, limit 1..100, offset + limit at most ${MAX_MERGED} through the gateway` });
    }
    const want = offset + limit;
    const answers = someAnswered(await this.each(f, EVENTS, () => null, async (node) => this.firstN(f, node, q, want)));
    const out: Event[] = [];
    const heads: Record<string, string> = {};
    for (const a of answers) {
      if (!a.ok) continue;
      out.push(...a.body);
      heads[a.node.nodeId] = a.headers.get("x-next-cursor") ?? "";
    }
    return Response.json(out.sort(byTime(asc)).slice(offset, want), { headers: { "x-next-cursor": encodeCursors(heads), ...unreachable(answers) } });
  }

  /** The first `n` events of `node` for `q` (pages of 100), and its head cursor. */
  private async firstN(f: FanOut, node: NodeRef, q: URLSearchParams, n: number): Promise<{ body: Event[]; headers: Headers }> {
    const out: Event[] = [];
    let headers = new Headers();
    for (let off = 0; off < n; off += 100) {
      const p = new URLSearchParams(q);
      p.set("offset", String(off));
      p.set("limit", String(Math.min(100, n - off)));
      const path = `/events/sandboxes?${p}`;
      const r = await callJson(node, "GET", path, undefined, f.apiKey, f.timeoutMs, f.maxBytes);
      if (r.status >= 400 && r.status < 500) throw new ClientFault(r.status, r.body);
      if (r.status >= 500) throw new GatewayError("gateway.node_unreachable", `node ${node.nodeId} answered HTTP ${r.status}`, { nodeId: node.nodeId });
      if (off === 0) headers = r.headers;
      const page = checkAnswer(node, r.body, path, r.status, EVENTS);
      out.push(...page);
      if (page.length < 100) break;
    }
    return { body: out, headers };
  }

  /** The union of the nodes' webhooks (one per id), oldest first. */
  private async webhooks(): Promise<Response> {
    const answers = someAnswered(await fanOut(await this.fan(), "/events/webhooks", WEBHOOKS));
    const byId = new Map<string, Static<typeof WEBHOOKS.schema>[number]>();
    for (const a of answers) if (a.ok) for (const w of a.body) if (!byId.has(w.id)) byId.set(w.id, w);
    const list = [...byId.values()].sort((a, b) => Date.parse(a.createdAt) - Date.parse(b.createdAt) || (a.id < b.id ? -1 : 1));
    return Response.json(list, { headers: unreachable(answers) });
  }

  /** A webhook's delivery log: every node's entries merged by their first attempt, each node paged by its own cursor. */
  private async deliveries(id: string, q: URLSearchParams): Promise<Response> {
    const f = await this.fan();
    const cursors = q.get("cursor") ? decodeCursors(q.get("cursor")!) : null;
    const asked = cursors ? { ...f, nodes: { ...f.nodes, live: f.nodes.live.filter((n) => cursors[n.nodeId]) } } : f;
    const answers = await this.each(asked, DELIVERIES, (n) => (cursors ? withParam(q, "cursor", cursors[n.nodeId]!) : q), undefined, `/events/webhooks/${id}/deliveries`, true);
    const found = answers.filter((a) => a.ok);
    if (found.length === 0) {
      const nf = answers.find((a) => !a.ok && a.error.startsWith("404"));
      if (nf || answers.every((a) => a.ok)) return Response.json({ code: 404, message: `Webhook not found: ${id}` }, { status: 404 });
      throw new GatewayError("gateway.node_unreachable", `no node answered the delivery log of ${id}`);
    }
    const first = (d: Deliveries["data"][number]) => ({ id: d.eventId, timestamp: d.attempts[0]?.timestamp ?? new Date(0).toISOString() });
    const asc = q.get("orderAsc") === "true";
    const data = found.flatMap((a) => (a.ok ? a.body.data : [])).sort((x, y) => byTime(asc)(first(x), first(y)));
    const next: Record<string, string> = {};
    for (const a of found) if (a.ok && a.body.nextCursor) next[a.node.nodeId] = a.body.nextCursor;
    return Response.json({ data, nextCursor: Object.keys(next).length ? encodeCursors(next) : null }, { headers: unreachable(answers) });
  }

  /**
   * `method path` with `body` on every live node. The first client fault (a bad field: every
   * node refuses it alike) answers as the node gave it; else the first success, with the nodes
   * that did not answer named; all 404: 404. `created` is the status of a success (201 for a
   * POST that became PUTs). `took`: the ids of the nodes that answered with success.
   */
  private async everywhere(method: string, path: string, b: unknown, created?: number): Promise<{ response: Response; took: string[] }> {
    const f = await this.fan();
    const answers = await Promise.all(
      f.nodes.live.map(async (node) => {
        try {
          return { node, r: await callJson(node, method, path, b, f.apiKey, f.timeoutMs, f.maxBytes) };
        } catch (e) {
          return { node, error: errorMessage(e) };
        }
      }),
    );
    const down = [...answers.filter((a) => "error" in a).map((a) => a.node.nodeId), ...f.nodes.unhealthy.map((n) => n.nodeId)];
    const headers = down.length ? { [UNREACHABLE_HEADER]: down.join(",") } : {};
    const got = answers.flatMap((a) => ("r" in a && a.r ? [a.r] : []));
    const took = answers.flatMap((a) => ("r" in a && a.r && a.r.status < 300 ? [a.node.nodeId] : []));
    const fault = got.find((r) => r.status >= 400 && r.status < 500 && r.status !== 404);
    if (fault) return { response: Response.json(fault.body, { status: fault.status, headers }), took: [] };
    const ok = got.find((r) => r.status < 300);
    if (ok) return { response: ok.body === null ? new Response(null, { status: ok.status, headers }) : Response.json(ok.body, { status: created ?? ok.status, headers }), took };
    const nf = got.find((r) => r.status === 404);
    if (nf) return { response: Response.json(nf.body, { status: 404, headers }), took };
    const bad = got[0];
    if (bad) return { response: Response.json(bad.body, { status: bad.status, headers }), took };
    throw new GatewayError("gateway.node_unreachable", `no node answered ${method} ${path}: ${answers.map((a) => ("error" in a ? a.error : "")).join("; ")}`, { nodeIds: down });
  }

  /** GET `pathAndQuery` on every live node; the first success, else the first answer that is not a 404 (a node's failure), else a 404. */
  private async firstKnowing(pathAndQuery: string): Promise<Response> {
    const f = await this.fan();
    const answers = await Promise.all(f.nodes.live.map((node) => callJson(node, "GET", pathAndQuery, undefined, f.apiKey, f.timeoutMs, f.maxBytes).then((r) => ({ node, r }), (e: unknown) => ({ node, error: String(e) }))));
    const got = answers.flatMap((a) => ("r" in a ? [a.r] : []));
    const hit = got.find((r) => r.status < 300) ?? got.find((r) => r.status !== 404) ?? got[0];
    if (!hit) throw new GatewayError("gateway.node_unreachable", `no node answered ${pathAndQuery}`);
    return Response.json(hit.body, { status: hit.status });
  }

  /**
   * GET each live node's answer to `path` with the query `queryOf(node)` (or `get(node)`), as
   * fan-out answers; a 404 of a node is its answer `!ok` "404 ..." when `notFoundIsAnswer`.
   */
  private async each<S extends TSchema>(
    f: FanOut,
    schema: JsonSchema<S>,
    queryOf: (n: NodeRef) => URLSearchParams | null,
    get?: (n: NodeRef) => Promise<{ body: Static<S>; headers: Headers }>,
    path = "/events/sandboxes",
    notFoundIsAnswer = false,
  ): Promise<NodeAnswer<Static<S>>[]> {
    const asked = await Promise.all(
      f.nodes.live.map(async (node): Promise<NodeAnswer<Static<S>>> => {
        try {
          if (get) return { node, ok: true, ...(await get(node)) };
          const q = queryOf(node);
          const pathAndQuery = `${path}${q && [...q].length ? `?${q}` : ""}`;
          const r = await callJson(node, "GET", pathAndQuery, undefined, f.apiKey, f.timeoutMs, f.maxBytes);
          if (r.status === 404 && notFoundIsAnswer) return { node, ok: false, error: `404 ${JSON.stringify(r.body)}` };
          if (r.status >= 400 && r.status < 500) throw new ClientFault(r.status, r.body);
          if (r.status >= 500) return { node, ok: false, error: `HTTP ${r.status}` };
          return { node, ok: true, body: checkAnswer(node, r.body, pathAndQuery, r.status, schema), headers: r.headers };
        } catch (e) {
          if (e instanceof ClientFault) throw e;
          return { node, ok: false, error: errorMessage(e) };
        }
      }),
    );
    return [...asked, ...f.nodes.unhealthy.map((node): NodeAnswer<Static<S>> => ({ node, ok: false, error: `node ${node.nodeId} is not asked: UNHEALTHY` }))];
  }
}

/** `q` with `name` set to `value`. */
function withParam(q: URLSearchParams, name: string, value: string): URLSearchParams {
  const p = new URLSearchParams(q);
  p.set(name, value);
  return p;
}
