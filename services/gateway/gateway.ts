/**
 * The gateway's request handling: the same E2B API as a node, for a cluster.
 * - POST /sandboxes, /v2/sandboxes: Schedule → create on that node → RecordAssignment (a node
 *   the request never reached, e.g. refusing the connection, is left out and Schedule asked
 *   again, up to create_attempts times).
 * - /sandboxes/{id}/..., /v2/sandboxes/{id}/...: to the sandbox's node (route cache, else
 *   LookupNode; unknown → 404 without asking any node). A connect or resume of a sandbox whose
 *   node is gone goes to the node the scheduler moves it to (moves.ts: cross-node resume).
 * - Sandbox traffic (dataplane.ts): to the sandbox's node, which proxies it into the sandbox.
 * - GET /sandboxes, /v2/sandboxes, /templates, /v2/templates, /snapshots, /nodes: every node the
 *   scheduler does not report UNHEALTHY, in parallel (aggregate.ts); GET /nodes/{id}: the node
 *   the scheduler names.
 * - Other template routes: `/templates/{id}...` and `/v2|v3/templates/{id}...` to a node that
 *   holds the template; DELETE /templates/{id} (also the SDK's deleteSnapshot) to every node
 *   holding a template or a user snapshot of that id or name; GET /templates/aliases/{alias}: the
 *   first node that knows the alias; new templates (POST /templates, /v2/templates,
 *   /v3/templates) to the node Schedule picks (templates are node-local until a shared snapshot
 *   repository exists). Forwarded control-plane requests carry x-forwarded-host/-proto, so upload
 *   URLs a node hands out point at the gateway; PUT /upload/template-files/{hash} (no API key:
 *   the URL's token authorises it) goes to the node that handed out that URL.
 * - Snapshots are node-local (unless `[snapshot.s3]` shares them): POST /sandboxes/{id}/snapshots
 *   and /fork go to the sandbox's node (fork children are bound to it, as creates are); a create
 *   naming a snapshot the scheduled node does not hold goes to a node whose GET /snapshots?name=
 *   lists it.
 * - GET /sandboxes/metrics?sandbox_ids=: split by node, asked in parallel, answers merged.
 * - /events/...: lifecycle events merged from every node; a webhook registered on every node,
 *   kept in the gateway's data directory and given to nodes that join later (events.ts).
 * A node that does not answer: 502 naming it. Scheduler down: creates 503; known sandboxes keep
 * routing from the route cache.
 */
import type { Logger } from "pino";
import { logger } from "../../src/observability/log.ts";
import { UPLOAD_PATH_RE } from "../../src/template/index.ts";
import type { NodeRef } from "../../src/cluster/index.ts";
import { Type as T } from "@sinclair/typebox";
import { jsonSchema } from "../../src/util/json-check.ts";
import { malformedJsonMessage, notJsonReason } from "../../src/util/json-body.ts";
import { ClientFault, fanOut, listV1, listV2, mergedList, RECORDS, type FanOut, type NodeAnswer } from "./aggregate.ts";
import type { GatewayConfig } from "./config.ts";
import { plausibleSandboxId, type DataRoute } from "./dataplane.ts";
import { gatewayError, GatewayError, GATEWAY_SOURCE, toGatewayResponse } from "./errors.ts";
import { checkAnswer, forwardToNode, neverReached, NODE_HEADER, nodeFailureOf, parseAnswer, readAnswer } from "./forward.ts";
import { GatewayEvents } from "./events.ts";
import { WebhookRegistry } from "./webhook-registry.ts";
import { WebhookSync } from "./webhook-sync.ts";
import { connectAnywhere } from "./moves.ts";
import { SchedulerLink, type ClusterNodes } from "./scheduler-link.ts";
import { GatewaySecrets } from "./secrets.ts";
import pkg from "../../package.json" with { type: "json" };
import { LruMap } from "../../src/util/lru.ts";
import { errorMessage } from "../../src/util/error.ts";

/** Sandbox operations that boot, snapshot or restore a VM: bounded by create_timeout_ms. */
const SLOW_OPS = new Set(["pause", "resume", "connect", "snapshots", "fork"]);

/** `GET /templates/{id}/files/{hash}`: the node answering it hands out the upload URL of `hash`. */
const FILES_PATH_RE = /^\/templates\/[^/]+\/files\/([0-9a-f]{64})$/;

/** A node's error codes that mean "the template named by a create is not here". */
const TEMPLATE_MISSING = new Set(["orchestrator.template_not_found", "template.not_found"]);

/** A Sandbox answer: the id the gateway reads; every other field passes through. */
const SANDBOX = T.Intersect([T.Record(T.String(), T.Unknown()), T.Object({ sandboxID: T.String() })]);

/** What the gateway reads of node answers (other fields pass through unread). */
const ANSWERS = {
  /** An error answer (`{code, message, error_code?}`): the code that says what is missing. */
  notFound: jsonSchema(T.Object({ error_code: T.String() })),
  /** A sandbox (create, connect, resume). */
  sandbox: jsonSchema(SANDBOX),
  /** A fork's answer: one entry per child, a sandbox or an error. */
  forked: jsonSchema(T.Array(T.Object({ sandbox: T.Optional(SANDBOX) }))),
  templates: jsonSchema(T.Array(T.Object({ templateID: T.String(), aliases: T.Optional(T.Array(T.String())), names: T.Optional(T.Array(T.String())) }))),
  snapshots: jsonSchema(T.Array(T.Object({ snapshotID: T.String() }))),
  metrics: jsonSchema(T.Object({ sandboxes: T.Optional(T.Record(T.String(), T.Unknown())) })),
};

/**
 * A path segment, percent-decoded.
 * @throws GatewayError bad_request for malformed percent-encoding.
 */
function segment(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    throw new GatewayError("gateway.bad_request", `malformed percent-encoding in the path segment ${JSON.stringify(s)}`);
  }
}

/**
 * The cluster's E2B API over a scheduler and its nodes: `control()` for API requests (key
 * checked by the listener), `data()` for sandbox traffic, `upload()` for template file uploads.
 * Holds the route cache, the scheduler link and the webhook registry with its sync loop.
 */
export class Gateway {
  /** Sandbox -> node routes learned (create, lookups, list answers); a sandbox moves only by a rebind (moves.ts, which sets it), so an entry stays right until it is deleted or its node answers 404. Known sandboxes keep routing from here while the scheduler is down. */
  readonly routes: LruMap<string, NodeRef>;
  readonly scheduler: SchedulerLink;
  /** Files hash -> the node whose upload URL for it was handed out through this gateway. */
  private readonly uploads: LruMap<string, NodeRef>;
  private readonly log: Logger = logger("gateway");
  private readonly nodeKey: string;
  /** Counters for /metrics and tests. */
  readonly stats = { requests: 0, nodeErrors: 0, schedulerErrors: 0 };
  /** `/events/...`: lifecycle events and webhooks over every node (events.ts). */
  private readonly events: GatewayEvents;
  /** Brings every live node up to the webhooks registered here (webhook-sync.ts). */
  readonly webhookSync: WebhookSync;
  /** The cluster's secrets store (secrets.ts). */
  readonly secrets: GatewaySecrets;

  /** @throws GatewayError bad_state when the webhook registry in the data directory cannot be read */
  constructor(readonly cfg: GatewayConfig, readonly apiKey: string) {
    this.routes = new LruMap(cfg.routeCacheSize);
    this.uploads = new LruMap(cfg.routeCacheSize);
    this.nodeKey = cfg.nodeApiKey || apiKey;
    this.secrets = new GatewaySecrets({ homePath: cfg.homePath, keyPath: cfg.secretsKeyPath, maxSecrets: cfg.maxSecrets, nodeKey: this.nodeKey, ...(cfg.secretsRedis ? { redis: cfg.secretsRedis } : {}) });
    this.scheduler = new SchedulerLink({ endpoint: cfg.schedulerEndpoint, timeoutMs: cfg.schedulerTimeoutMs, retryMs: cfg.schedulerRetryMs, nodeListTtlMs: cfg.nodeListTtlMs });
    const registry = new WebhookRegistry(cfg.homePath);
    this.webhookSync = new WebhookSync(registry, () => this.fan(), cfg.webhookSync, this.log);
    this.events = new GatewayEvents(() => this.fan(), async (req) => (await this.jsonBody(req)).json, { registry, sync: this.webhookSync });
  }

  /** Stop the webhook sync (after its round), release the scheduler link and the secrets store. */
  async close(): Promise<void> {
    await this.webhookSync.stop();
    this.scheduler.close();
    this.secrets.close();
  }

  /**
   * The node holding `sandboxId`: route cache, else the scheduler. A cached node the scheduler
   * reports UNHEALTHY is asked about again (the sandbox may have moved to another node; the
   * cache serves while the scheduler is down).
   * @returns null when no node holds it.
   * @throws GatewayError scheduler_unavailable (cache miss while the scheduler is down)
   */
  async resolve(sandboxId: string): Promise<NodeRef | null> {
    if (!plausibleSandboxId(sandboxId)) return null;
    const cached = this.routes.get(sandboxId);
    if (cached && !this.scheduler.seemsUnhealthy(cached.nodeId)) return cached;
    let n: NodeRef | null;
    try {
      n = await this.scheduler.lookup(sandboxId);
    } catch (e) {
      if (cached) return cached;
      throw e;
    }
    if (n) this.routes.set(sandboxId, n);
    else this.routes.delete(sandboxId);
    return n;
  }

  private learn = (id: string, n: NodeRef) => {
    if (!this.routes.get(id)) this.routes.set(id, n);
  };

  /** Map a failure to its response, counting node and scheduler errors. */
  private failed(req: Request, url: URL, e: unknown): Response {
    if (e instanceof ClientFault) return Response.json(e.body, { status: e.status });
    if (e instanceof GatewayError) {
      if (e.code === "gateway.node_unreachable") this.stats.nodeErrors++;
      if (e.code === "gateway.scheduler_unavailable") this.stats.schedulerErrors++;
      this.log.warn({ method: req.method, path: url.pathname, code: e.code, err: e.message }, "gateway answered an error");
    } else this.log.error({ method: req.method, path: url.pathname, err: e }, "gateway failed");
    return toGatewayResponse(e);
  }

  /** Control-plane request (API key already checked). */
  async control(req: Request, url: URL, clientIp: string | null): Promise<Response> {
    this.stats.requests++;
    try {
      return await this.dispatch(req, url, clientIp);
    } catch (e) {
      return this.failed(req, url, e);
    }
  }

  private async dispatch(req: Request, url: URL, clientIp: string | null): Promise<Response> {
    const path = url.pathname;
    const m = req.method;
    if (path === "/health") return Response.json({ status: "ok", version: pkg.version, role: "gateway" });
    if (path === "/metrics") return this.metrics();
    // the cluster's one secrets store lives here, never on a node
    if (path === "/secrets" || path.startsWith("/secrets/")) return this.secrets.handle(req);
    if (m === "POST" && (path === "/sandboxes" || path === "/v2/sandboxes")) return this.create(req, url, clientIp);
    if (m === "GET" && path === "/v2/sandboxes") return listV2(await this.fan(), url.searchParams, this.learn);
    if (m === "GET" && path === "/sandboxes") return listV1(await this.fan(), url.search, this.learn);
    if (m === "GET" && path === "/sandboxes/metrics") return this.metricsByIds(url);
    if (path.startsWith("/events/")) return (await this.events.handle(req, url)) ?? gatewayError("gateway.no_route", `no route ${m} ${path}`);
    const sbx = /^(?:\/v2)?\/sandboxes\/([^/]+)(?:\/([^/]+))?/.exec(path);
    if (sbx) return this.bySandbox(req, url, segment(sbx[1]!), sbx[2], clientIp);
    if (m === "GET" && (path === "/templates" || path === "/v2/templates")) return (await mergedList(await this.fan(), path + url.search, "templateID")).response;
    if (m === "GET" && path === "/snapshots") return (await mergedList(await this.fan(), path + url.search, "snapshotID")).response;
    const alias = /^\/templates\/aliases\/([^/]+)$/.exec(path);
    if (alias && m === "GET") return this.firstKnowing(req, url, `/templates/aliases/${encodeURIComponent(segment(alias[1]!))}`, clientIp);
    const tpl = /^\/(?:v[23]\/)?templates(?:\/([^/]+))?/.exec(path);
    if (tpl) return this.template(req, url, tpl[1] ? segment(tpl[1]) : null, clientIp);
    if (m === "GET" && path === "/nodes") return this.listNodes();
    const node = /^\/nodes\/([^/]+)$/.exec(path);
    if (node) return this.oneNode(req, url, segment(node[1]!), clientIp);
    return gatewayError("gateway.no_route", `no route ${m} ${path}`);
  }

  /** Prometheus text of the gateway's counters. */
  private metrics(): Response {
    const g: [string, string, number][] = [
      ["agentenv_gateway_requests_total", "Requests handled (control plane and sandbox traffic).", this.stats.requests],
      ["agentenv_gateway_node_errors_total", "Requests answered 502 because a node did not answer.", this.stats.nodeErrors],
      ["agentenv_gateway_scheduler_errors_total", "Requests answered 503 because the scheduler did not answer.", this.stats.schedulerErrors],
      ["agentenv_gateway_route_cache_entries", "Sandbox routes in the gateway's cache.", this.routes.size],
    ];
    const text = g.map(([n, help, v]) => `# HELP ${n} ${help}\n# TYPE ${n} ${n.endsWith("_total") ? "counter" : "gauge"}\n${n} ${v}`).join("\n") + "\n";
    return new Response(text, { headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" } });
  }

  /** Discovered nodes by health. @throws GatewayError scheduler_unavailable (and no list known), no_nodes */
  private async nodes(): Promise<ClusterNodes> {
    const set = await this.scheduler.listNodes();
    if (set.live.length === 0 && set.unhealthy.length === 0) throw new GatewayError("gateway.no_nodes", "the scheduler knows no nodes");
    return set;
  }

  private async fan(): Promise<FanOut> {
    return { nodes: await this.nodes(), apiKey: this.nodeKey, timeoutMs: this.cfg.requestTimeoutMs, maxBytes: this.cfg.maxAnswerBytes };
  }

  /**
   * A control-plane request to `node`, with the node key and the gateway's origin in
   * x-forwarded-host/-proto (a client's own x-forwarded-* are kept: the gateway may sit behind
   * a proxy), so URLs the node builds for the client point at the gateway.
   */
  private forward(req: Request, url: URL, node: NodeRef, clientIp: string | null, slow: boolean, body?: Uint8Array | null, pathAndQuery = url.pathname + url.search, extra: Record<string, string> = {}): Promise<Response> {
    const set: Record<string, string> = {
      ...extra,
      "x-api-key": this.nodeKey,
      "x-forwarded-host": req.headers.get("x-forwarded-host") ?? req.headers.get("host") ?? url.host,
      "x-forwarded-proto": req.headers.get("x-forwarded-proto") ?? url.protocol.replace(":", ""),
    };
    return forwardToNode(req, node, { pathAndQuery, timeoutMs: slow ? this.cfg.createTimeoutMs : this.cfg.requestTimeoutMs, idleTimeoutMs: this.cfg.idleTimeoutMs, set, clientIp, body });
  }

  /**
   * Read a JSON body, counting bytes as they arrive: reading stops at max_body_bytes (a chunked
   * body is never buffered whole).
   * @throws GatewayError body_too_large, bad_request
   */
  private async jsonBody(req: Request): Promise<{ bytes: Uint8Array; json: Record<string, unknown> }> {
    const max = this.cfg.maxBodyBytes;
    const chunks: Uint8Array[] = [];
    let n = 0;
    if (req.body) {
      const reader = req.body.getReader();
      for (;;) {
        const r = await reader.read();
        if (r.done) break;
        n += r.value.length;
        if (n > max) {
          await reader.cancel().catch(() => {});
          throw new GatewayError("gateway.body_too_large", `request body exceeds the limit of ${max} bytes`, { maxBytes: max });
        }
        chunks.push(r.value);
      }
    }
    const bytes = new Uint8Array(Buffer.concat(chunks));
    const notJson = bytes.length ? notJsonReason(req.headers.get("content-type")) : null;
    if (notJson) throw new GatewayError("gateway.bad_request", notJson);
    let json: unknown;
    try {
      json = bytes.length ? JSON.parse(new TextDecoder().decode(bytes)) : {};
    } catch (e) {
      throw new GatewayError("gateway.bad_request", malformedJsonMessage(errorMessage(e)));
    }
    if (typeof json !== "object" || json === null || Array.isArray(json)) throw new GatewayError("gateway.bad_request", "the request body must be a JSON object");
    return { bytes, json: json as Record<string, unknown> };
  }

  /**
   * Rewrite `domain` of a Sandbox body to the gateway's (clients must not bypass it). A JSON answer
   * is read whole (at most max_answer_bytes) and must be a Sandbox.
   * @throws GatewayError node_unreachable (`bad_answer`) for a longer or malformed one.
   */
  private async withOurDomain(res: Response, node: NodeRef, what: string): Promise<{ res: Response; body: Record<string, unknown> | null }> {
    if (!(res.headers.get("content-type") ?? "").includes("json")) return { res, body: null };
    const value = parseAnswer(node, await readAnswer(node, res, what, this.cfg.maxAnswerBytes), what, res.status);
    const body: Record<string, unknown> = checkAnswer(node, value, what, res.status, ANSWERS.sandbox);
    body.domain = this.cfg.domains[0] ?? null;
    const h = new Headers(res.headers);
    h.delete("content-length");
    return { res: Response.json(body, { status: res.status, headers: h }), body };
  }

  /**
   * POST /sandboxes, /v2/sandboxes. Up to create_attempts tries: a node the request never
   * reached is left out; when Schedule names a node already tried (least_loaded keeps naming the
   * emptiest node, and a node killed a moment ago still looks empty), the next live node that
   * is neither tried nor draining is taken instead.
   */
  private async create(req: Request, url: URL, clientIp: string | null): Promise<Response> {
    const { bytes, json } = await this.jsonBody(req);
    const md = json.metadata && typeof json.metadata === "object" ? Object.fromEntries(Object.entries(json.metadata as Record<string, unknown>).map(([k, v]) => [k, String(v)])) : {};
    const tried = new Set<string>();
    let lastErr: GatewayError | undefined;
    for (let attempt = 0; attempt < this.cfg.createAttempts; attempt++) {
      let node = await this.scheduler.schedule(md);
      if (tried.has(node.nodeId)) {
        const set = await this.nodes();
        const next = set.live.find((n) => !tried.has(n.nodeId) && !set.draining.has(n.nodeId));
        if (!next) break;
        node = next;
      }
      tried.add(node.nodeId);
      let res: Response;
      try {
        res = await this.forward(req, url, node, clientIp, true, bytes);
      } catch (e) {
        if (e instanceof GatewayError && neverReached(nodeFailureOf(e))) {
          this.log.warn({ nodeId: node.nodeId, failure: nodeFailureOf(e), err: e.message }, "create: the node was not reached; scheduling again");
          lastErr = e;
          continue;
        }
        throw e;
      }
      if (res.status === 404) {
        // templates are node-local: place the sandbox on a node that holds the template
        const text = new TextDecoder().decode(await readAnswer(node, res, "a create", this.cfg.maxAnswerBytes));
        const holder = await this.templateHolder(String(json.templateID ?? ""), text);
        if (!holder || holder.nodeId === node.nodeId) return new Response(text, { status: 404, headers: res.headers });
        this.log.info({ template: json.templateID, from: node.nodeId, to: holder.nodeId }, "create: template not on the scheduled node; creating where it is");
        res = await this.forward(req, url, holder, clientIp, true, bytes);
        if (res.status !== 201) return res;
        return this.created(res, holder);
      }
      if (res.status !== 201) return res;
      return this.created(res, node);
    }
    throw lastErr ?? new GatewayError("gateway.no_nodes", `no reachable node to create on (tried ${[...tried].join(", ") || "none"})`);
  }

  /**
   * A node holding template `id` (id, alias or name) or a user snapshot of that id or name, when
   * a node's 404 error code says the template is missing there. Templates first (by the nodes'
   * lists), then snapshots (GET /snapshots?name=), both asked at once.
   */
  private async templateHolder(id: string, notFoundBody: string): Promise<NodeRef | null> {
    const missing = ANSWERS.notFound.parse(notFoundBody);
    if (!id || !missing.ok || !TEMPLATE_MISSING.has(missing.value.error_code)) return null;
    const [answers, snapshots] = await Promise.all([fanOut(await this.fan(), "/templates", ANSWERS.templates), this.snapshotHolders(id)]);
    for (const a of answers) {
      if (a.ok && a.body.some((t) => t.templateID === id || t.aliases?.includes(id) || t.names?.includes(id))) return a.node;
    }
    return snapshots[0] ?? null;
  }

  /**
   * The live nodes whose user snapshots include `ref` (an id, or a name with or without its
   * tag), by each node's GET /snapshots?name=; a node that does not answer, or refuses the
   * query, is taken not to hold it.
   */
  private async snapshotHolders(ref: string): Promise<NodeRef[]> {
    let answers: NodeAnswer<{ snapshotID: string }[]>[];
    try {
      answers = await fanOut(await this.fan(), `/snapshots?name=${encodeURIComponent(ref)}`, ANSWERS.snapshots);
    } catch (e) {
      if (e instanceof ClientFault) return [];
      throw e;
    }
    return answers.filter((a) => a.ok && a.body.length > 0).map((a) => a.node);
  }

  /** A 201 create answer: our domain, the route cached, the binding recorded. */
  private async created(res: Response, node: NodeRef): Promise<Response> {
    const out = await this.withOurDomain(res, node, "a create");
    const id = out.body?.sandboxID;
    if (typeof id === "string") {
      this.routes.set(id, node);
      try {
        await this.scheduler.record(id, node);
      } catch (e) {
        // the node's next heartbeat roster binds it anyway; the route cache serves it meanwhile
        this.log.warn({ sandboxId: id, nodeId: node.nodeId, err: errorMessage(e) }, "RecordAssignment failed");
      }
    }
    return out.res;
  }

  private async bySandbox(req: Request, url: URL, id: string, op: string | undefined, clientIp: string | null): Promise<Response> {
    const node = await this.resolve(id);
    if (!node) return gatewayError("gateway.sandbox_not_found", `sandbox "${id}" doesn't exist or you don't have access to it`);
    if ((op === "connect" || op === "resume") && req.method === "POST") return this.connect(req, url, id, op, node, clientIp);
    const res = await this.forward(req, url, node, clientIp, op !== undefined && SLOW_OPS.has(op));
    if (res.status === 404 && !op) this.routes.delete(id);
    if (req.method === "DELETE" && !op && (res.status === 204 || res.status === 404)) this.routes.delete(id);
    if (op === "fork" && req.method === "POST" && res.status === 201) return this.forked(res, node);
    return res;
  }

  /**
   * POST /sandboxes/{id}/connect or /resume: to its node, or, when that node is gone, to the node
   * the scheduler moves the sandbox to, which resumes it from the shared snapshot store (moves.ts).
   */
  private async connect(req: Request, url: URL, id: string, op: string, node: NodeRef, clientIp: string | null): Promise<Response> {
    const { bytes } = await this.jsonBody(req);
    const send = (n: NodeRef, extra?: Record<string, string>) => this.forward(req, url, n, clientIp, true, bytes, undefined, extra);
    const { res, node: at } = await connectAnywhere({ scheduler: this.scheduler, routes: this.routes, log: this.log, send }, id, node);
    if (res.status === 200 || res.status === 201) return (await this.withOurDomain(res, at, `a ${op}`)).res;
    return res;
  }

  /**
   * A 201 fork answer (`[{sandbox} | {error}]`): every child runs on its parent's node, so each
   * is cached and recorded there like a create, and shown with the gateway's domain.
   */
  private async forked(res: Response, node: NodeRef): Promise<Response> {
    const body = checkAnswer(node, parseAnswer(node, await readAnswer(node, res, "a fork", this.cfg.maxAnswerBytes), "a fork", res.status), "a fork", res.status, ANSWERS.forked);
    const children = body.flatMap((r) => (r.sandbox ? [r.sandbox] : []));
    await Promise.all(
      children.map(async (c) => {
        const id = c.sandboxID;
        c.domain = this.cfg.domains[0] ?? null;
        this.routes.set(id, node);
        try {
          await this.scheduler.record(id, node);
        } catch (e) {
          this.log.warn({ sandboxId: id, nodeId: node.nodeId, err: errorMessage(e) }, "RecordAssignment of a fork child failed");
        }
      }),
    );
    const h = new Headers(res.headers);
    h.delete("content-length");
    return Response.json(body, { status: res.status, headers: h });
  }

  /** GET /sandboxes/metrics?sandbox_ids=a,b: each id's node asked for its share, all nodes at once. */
  private async metricsByIds(url: URL): Promise<Response> {
    const ids = (url.searchParams.get("sandbox_ids") ?? "").split(",").filter(Boolean);
    if (ids.length === 0 || ids.length > 100) return gatewayError("gateway.bad_request", "sandbox_ids must name 1 to 100 sandboxes");
    const resolved = await Promise.all(ids.map(async (id) => ({ id, node: await this.resolve(id) })));
    const byNode = new Map<string, { node: NodeRef; ids: string[] }>();
    for (const { id, node } of resolved) {
      if (!node) continue;
      const e = byNode.get(node.nodeId) ?? { node, ids: [] };
      e.ids.push(id);
      byNode.set(node.nodeId, e);
    }
    const out: Record<string, unknown> = {};
    await Promise.all(
      [...byNode.values()].map(async ({ node, ids: mine }) => {
        const f: FanOut = { nodes: { live: [node], unhealthy: [], draining: new Set() }, apiKey: this.nodeKey, timeoutMs: this.cfg.requestTimeoutMs, maxBytes: this.cfg.maxAnswerBytes };
        const [a] = await fanOut(f, `/sandboxes/metrics?sandbox_ids=${mine.join(",")}`, ANSWERS.metrics);
        if (a?.ok) Object.assign(out, a.body.sandboxes ?? {});
      }),
    );
    return Response.json({ sandboxes: out });
  }

  /**
   * GET `pathAndQuery` on every live node at once; the answer of the first node (in node
   * order) that does not answer 404 is forwarded. All 404: the first 404.
   * @throws GatewayError node_unreachable naming every node when none answered.
   */
  private async firstKnowing(req: Request, url: URL, pathAndQuery: string, clientIp: string | null): Promise<Response> {
    const { live } = await this.nodes();
    const get = new Request(req.url, { headers: req.headers, signal: req.signal });
    const answers = await Promise.all(live.map((n) => this.forward(get, url, n, clientIp, false, undefined, pathAndQuery).then((res) => ({ n, res }), (err: unknown) => ({ n, err }))));
    const found = answers.find((a) => "res" in a && a.res.status !== 404) ?? answers.find((a) => "res" in a);
    for (const a of answers) if (a !== found && "res" in a) await a.res.body?.cancel();
    if (found && "res" in found) return found.res;
    throw new GatewayError("gateway.node_unreachable", `no node answered ${pathAndQuery}: ${answers.map((a) => ("err" in a ? errorMessage(a.err) : "")).join("; ")}`, { nodeIds: live.map((n) => n.nodeId) });
  }

  /** The nodes holding template `id` (id, alias or build id), by the nodes' lists, else by asking each. */
  private async templateHolders(req: Request, url: URL, id: string, clientIp: string | null): Promise<NodeRef[]> {
    const { holders } = await mergedList(await this.fan(), "/templates", "templateID");
    const listed = holders.get(id);
    if (listed?.length) return listed;
    // aliases and build ids are not in the list: ask every node
    const res = await this.firstKnowing(req, url, `/templates/${encodeURIComponent(id)}`, clientIp).catch(() => null);
    await res?.body?.cancel();
    if (!res || res.status === 404) return [];
    const nodeId = res.headers.get(NODE_HEADER);
    return (await this.nodes()).live.filter((n) => n.nodeId === nodeId);
  }

  private async template(req: Request, url: URL, id: string | null, clientIp: string | null): Promise<Response> {
    if (id === null || (req.method === "POST" && /^\/(v[23]\/)?templates$/.test(url.pathname))) {
      // a new template: built where Schedule places it
      const node = await this.scheduler.schedule({});
      return this.forward(req, url, node, clientIp, true);
    }
    const deleting = req.method === "DELETE" && /^\/templates\/[^/]+$/.test(url.pathname);
    const holders = deleting ? await this.deleteHolders(req, url, id, clientIp) : await this.templateHolders(req, url, id, clientIp);
    if (holders.length === 0) return gatewayError("gateway.no_route", deleting ? `no template or snapshot ${id} is on any node` : `template ${id} is not on any node`);
    if (req.method === "DELETE" && holders.length > 1) return this.deleteEverywhere(req, url, holders, clientIp);
    const holder = holders[0]!;
    const res = await this.forward(req, url, holder, clientIp, req.method !== "GET");
    const files = FILES_PATH_RE.exec(url.pathname);
    if (files && req.method === "GET" && res.ok) this.uploads.set(files[1]!, holder);
    return res;
  }

  /**
   * The nodes a DELETE /templates/{id} goes to: those holding template `id` and those holding a
   * user snapshot `id` (the SDK deletes snapshots with this route), without repeats.
   */
  private async deleteHolders(req: Request, url: URL, id: string, clientIp: string | null): Promise<NodeRef[]> {
    const [tpl, snap] = await Promise.all([this.templateHolders(req, url, id, clientIp), this.snapshotHolders(id)]);
    const out = [...tpl];
    for (const n of snap) if (!out.some((o) => o.nodeId === n.nodeId)) out.push(n);
    return out;
  }

  /** DELETE a template every holder has: each node's answer; the first failure wins, else the first answer. */
  private async deleteEverywhere(req: Request, url: URL, holders: NodeRef[], clientIp: string | null): Promise<Response> {
    const answers = await Promise.all(holders.map((n) => this.forward(new Request(req.url, { method: "DELETE", headers: req.headers }), url, n, clientIp, true)));
    const bad = answers.find((r) => !r.ok && r.status !== 404);
    const keep = bad ?? answers[0]!;
    for (const r of answers) if (r !== keep) await r.body?.cancel();
    return keep;
  }

  /**
   * PUT /upload/template-files/{hash}?expires&token (no API key: the token authorises it), to
   * the node whose GET /templates/{id}/files/{hash} answer handed out the URL.
   */
  async upload(req: Request, url: URL, clientIp: string | null): Promise<Response> {
    this.stats.requests++;
    const m = UPLOAD_PATH_RE.exec(url.pathname);
    if (!m) return gatewayError("gateway.no_route", `no route ${req.method} ${url.pathname}`);
    const node = this.uploads.get(m[1]!);
    if (!node) return gatewayError("gateway.no_route", `no upload of ${m[1]} is expected here: ask GET /templates/{id}/files/${m[1]} through this gateway first`);
    try {
      return await forwardToNode(req, node, { pathAndQuery: url.pathname + url.search, timeoutMs: this.cfg.createTimeoutMs, idleTimeoutMs: this.cfg.idleTimeoutMs, clientIp });
    } catch (e) {
      return this.failed(req, url, e);
    }
  }

  /** GET /nodes: every node's own answer; an unreachable or UNHEALTHY node from its last report. */
  private async listNodes(): Promise<Response> {
    const f = await this.fan();
    const [answers, observed] = await Promise.all([fanOut(f, "/nodes", RECORDS), this.scheduler.observed().catch(() => [])]);
    const out: Record<string, unknown>[] = [];
    for (const a of answers) {
      if (a.ok) out.push(...a.body);
      else {
        const o = observed.find((n) => n.nodeId === a.node.nodeId);
        out.push({ id: a.node.nodeId, nodeID: a.node.nodeId, serviceInstanceID: o?.serviceInstanceId ?? "", clusterID: o?.clusterId ?? "", status: "unhealthy", version: o?.version ?? "", commit: o?.commit ?? "", sandboxCount: o?.snapshot?.sandboxCount ?? 0, message: a.error });
      }
    }
    return Response.json(out.sort((x, y) => (String(x.id) < String(y.id) ? -1 : 1)));
  }

  private async oneNode(req: Request, url: URL, nodeId: string, clientIp: string | null): Promise<Response> {
    const n = await this.scheduler.node(nodeId);
    if (!n || !n.endpoint) return gatewayError("gateway.node_not_found", `node ${nodeId} not found`);
    return this.forward(req, url, { nodeId, endpoint: n.endpoint }, clientIp, false);
  }

  /**
   * Forward sandbox traffic (HTTP) to the node holding it. Unknown sandbox → 502 as the E2B
   * proxy answers; node down → 502 naming it.
   */
  async data(req: Request, url: URL, route: DataRoute, clientIp: string | null): Promise<Response> {
    this.stats.requests++;
    let node: NodeRef | null;
    try {
      node = await this.resolve(route.sandboxId);
    } catch (e) {
      return dataError(route.sandboxId, e);
    }
    if (!node) return dataError(route.sandboxId, null);
    try {
      // the node's proxy waits response_timeout_ms for the sandbox's answer (slow and long-polling
      // endpoints): so does the gateway
      const answerMs = this.cfg.responseTimeoutMs;
      return await forwardToNode(req, node, { pathAndQuery: url.pathname + url.search, timeoutMs: this.cfg.requestTimeoutMs, idleTimeoutMs: this.cfg.idleTimeoutMs, afterBodyMs: answerMs, answerMs, set: routeHeaders(route), clientIp });
    } catch (e) {
      this.stats.nodeErrors++;
      return dataError(route.sandboxId, e);
    }
  }
}

/** Headers that tell the node which sandbox and port (host routes become header routes). */
export function routeHeaders(route: DataRoute): Record<string, string> {
  return route.via === "host" ? { "x-agentenv-sandbox-id": route.sandboxId, "x-agentenv-sandbox-port": String(route.port) } : {};
}

/**
 * A data-plane failure in the E2B edge proxy's shape `{sandboxId, message, code}`: 503 when the
 * scheduler is down, else 502; `e` null = no node holds the sandbox.
 */
export function dataError(sandboxId: string, e: unknown): Response {
  const status = e instanceof GatewayError && e.code === "gateway.scheduler_unavailable" ? 503 : 502;
  const message = e === null ? "The sandbox was not found" : errorMessage(e);
  return Response.json({ sandboxId, message, code: status }, { status, headers: { [GATEWAY_SOURCE]: "gateway" } });
}
