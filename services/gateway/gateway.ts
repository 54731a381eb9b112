/**
 * The gateway's request handling: the same E2B API as a node, for a cluster.
 * - POST /sandboxes, /v2/sandboxes: Schedule → create on that node → RecordAssignment (a node
 *   refusing the connection is skipped for the next one Schedule picks).
 * - /sandboxes/{id}/..., /v2/sandboxes/{id}/...: to the sandbox's node (route cache, else
 *   LookupNode; unknown → 404 without asking any node).
 * - Sandbox traffic (dataplane.ts): to the sandbox's node, which proxies it into the sandbox.
 * - GET /sandboxes, /v2/sandboxes, /templates, /v2/templates, /snapshots, /nodes: every node
 *   (aggregate.ts); GET /nodes/{id}: the node the scheduler names.
 * - Other template routes: `/templates/{id}...` and `/v2|v3/templates/{id}...` to a node that
 *   lists the template; new templates (POST /templates, /v2/templates, /v3/templates) to the
 *   node Schedule picks (templates are node-local until a shared snapshot repository exists).
 * - GET /sandboxes/metrics?sandbox_ids=: split by node, answers merged.
 * A node that does not answer: 502 naming it. Scheduler down: creates 503; known sandboxes keep
 * routing from the route cache.
 */
import type { Logger } from "pino";
import { logger } from "../../src/observability/log.ts";
import type { NodeRef } from "../scheduler/types.ts";
import { ClientFault, fanOut, listV1, listV2, mergedList } from "./aggregate.ts";
import type { GatewayConfig } from "./config.ts";
import { plausibleSandboxId, type DataRoute } from "./dataplane.ts";
import { gatewayError, GatewayError, toGatewayResponse } from "./errors.ts";
import { forwardToNode } from "./forward.ts";
import { RouteCache } from "./route-cache.ts";
import { SchedulerLink } from "./scheduler-link.ts";
import pkg from "../../package.json" with { type: "json" };

/** Sandbox operations that boot, snapshot or restore a VM: bounded by create_timeout_ms. */
const SLOW_OPS = new Set(["pause", "resume", "connect", "snapshots", "fork"]);

export class Gateway {
  readonly routes: RouteCache;
  readonly scheduler: SchedulerLink;
  private readonly log: Logger = logger("gateway");
  private readonly nodeKey: string;
  /** Counters for /metrics and tests. */
  readonly stats = { requests: 0, nodeErrors: 0, schedulerErrors: 0 };

  constructor(readonly cfg: GatewayConfig, readonly apiKey: string) {
    this.routes = new RouteCache(cfg.routeCacheSize);
    this.scheduler = new SchedulerLink(cfg.schedulerEndpoint, cfg.schedulerTimeoutMs, cfg.nodeListTtlMs);
    this.nodeKey = cfg.nodeApiKey || apiKey;
  }

  close(): void {
    this.scheduler.close();
  }

  /**
   * The node holding `sandboxId`: route cache, else the scheduler.
   * @returns null when no node holds it.
   * @throws GatewayError scheduler_unavailable (cache miss while the scheduler is down)
   */
  async resolve(sandboxId: string): Promise<NodeRef | null> {
    if (!plausibleSandboxId(sandboxId)) return null;
    const cached = this.routes.get(sandboxId);
    if (cached) return cached;
    const n = await this.scheduler.lookup(sandboxId);
    if (n) this.routes.set(sandboxId, n);
    return n;
  }

  private learn = (id: string, n: NodeRef) => {
    if (!this.routes.get(id)) this.routes.set(id, n);
  };

  /** Control-plane request (API key already checked). */
  async control(req: Request, url: URL, clientIp: string | null): Promise<Response> {
    this.stats.requests++;
    try {
      return await this.dispatch(req, url, clientIp);
    } catch (e) {
      if (e instanceof ClientFault) return Response.json(e.body, { status: e.status });
      if (e instanceof GatewayError) {
        if (e.code === "gateway.node_unreachable") this.stats.nodeErrors++;
        if (e.code === "gateway.scheduler_unavailable") this.stats.schedulerErrors++;
        this.log.warn({ method: req.method, path: url.pathname, code: e.code, err: e.message }, "gateway answered an error");
      } else this.log.error({ method: req.method, path: url.pathname, err: e }, "gateway failed");
      return toGatewayResponse(e);
    }
  }

  private async dispatch(req: Request, url: URL, clientIp: string | null): Promise<Response> {
    const path = url.pathname;
    const m = req.method;
    if (path === "/health") return Response.json({ status: "ok", version: pkg.version, role: "gateway" });
    if (path === "/metrics") return this.metrics();
    if (m === "POST" && (path === "/sandboxes" || path === "/v2/sandboxes")) return this.create(req, url, clientIp);
    if (m === "GET" && path === "/v2/sandboxes") return listV2(await this.nodes(), url.searchParams, this.nodeKey, this.cfg.requestTimeoutMs, this.learn);
    if (m === "GET" && path === "/sandboxes") return listV1(await this.nodes(), url.search, this.nodeKey, this.cfg.requestTimeoutMs, this.learn);
    if (m === "GET" && path === "/sandboxes/metrics") return this.metricsByIds(url);
    const sbx = /^(?:\/v2)?\/sandboxes\/([^/]+)(?:\/([^/]+))?/.exec(path);
    if (sbx) return this.bySandbox(req, url, decodeURIComponent(sbx[1]!), sbx[2], clientIp);
    if (m === "GET" && (path === "/templates" || path === "/v2/templates")) return (await mergedList(await this.nodes(), path + url.search, "templateID", this.nodeKey, this.cfg.requestTimeoutMs)).response;
    if (m === "GET" && path === "/snapshots") return (await mergedList(await this.nodes(), path + url.search, "snapshotID", this.nodeKey, this.cfg.requestTimeoutMs)).response;
    const tpl = /^\/(?:v[23]\/)?templates(?:\/([^/]+))?/.exec(path);
    if (tpl) return this.template(req, url, tpl[1] ? decodeURIComponent(tpl[1]) : null, clientIp);
    if (m === "GET" && path === "/nodes") return this.listNodes();
    const node = /^\/nodes\/([^/]+)$/.exec(path);
    if (node) return this.oneNode(req, url, decodeURIComponent(node[1]!), clientIp);
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

  /** Discovered nodes. @throws GatewayError scheduler_unavailable (and no list known), no_nodes */
  private async nodes(): Promise<NodeRef[]> {
    const list = await this.scheduler.listNodes();
    if (list.length === 0) throw new GatewayError("gateway.no_nodes", "the scheduler knows no nodes");
    return list;
  }

  private forward(req: Request, url: URL, node: NodeRef, clientIp: string | null, slow: boolean, body?: Uint8Array | null): Promise<Response> {
    return forwardToNode(req, node, { pathAndQuery: url.pathname + url.search, timeoutMs: slow ? this.cfg.createTimeoutMs : this.cfg.requestTimeoutMs, set: { "x-api-key": this.nodeKey }, clientIp, body });
  }

  /** Read a bounded JSON body. @throws GatewayError body_too_large, bad_request */
  private async jsonBody(req: Request): Promise<{ bytes: Uint8Array; json: Record<string, unknown> }> {
    const bytes = new Uint8Array(await req.arrayBuffer());
    if (bytes.length > this.cfg.maxBodyBytes) throw new GatewayError("gateway.body_too_large", `request body of ${bytes.length} bytes exceeds the limit of ${this.cfg.maxBodyBytes}`);
    let json: unknown;
    try {
      json = bytes.length ? JSON.parse(new TextDecoder().decode(bytes)) : {};
    } catch (e) {
      throw new GatewayError("gateway.bad_request", `malformed request body: ${(e as Error).message}`);
    }
    if (typeof json !== "object" || json === null || Array.isArray(json)) throw new GatewayError("gateway.bad_request", "the request body must be a JSON object");
    return { bytes, json: json as Record<string, unknown> };
  }

  /** Rewrite `domain` of a Sandbox body to the gateway's (clients must not bypass it). */
  private async withOurDomain(res: Response): Promise<{ res: Response; body: Record<string, unknown> | null }> {
    if (!(res.headers.get("content-type") ?? "").includes("json")) return { res, body: null };
    const body = (await res.json()) as Record<string, unknown>;
    if (body && typeof body === "object" && "sandboxID" in body) body.domain = this.cfg.domains[0] ?? null;
    const h = new Headers(res.headers);
    h.delete("content-length");
    return { res: Response.json(body, { status: res.status, headers: h }), body };
  }

  private async create(req: Request, url: URL, clientIp: string | null): Promise<Response> {
    const { bytes, json } = await this.jsonBody(req);
    const md = json.metadata && typeof json.metadata === "object" ? Object.fromEntries(Object.entries(json.metadata as Record<string, unknown>).map(([k, v]) => [k, String(v)])) : {};
    const tried = new Set<string>();
    let lastErr: GatewayError | undefined;
    for (let attempt = 0; attempt < 3; attempt++) {
      const node = await this.scheduler.schedule(md);
      if (tried.has(node.nodeId)) break;
      tried.add(node.nodeId);
      let res: Response;
      try {
        res = await this.forward(req, url, node, clientIp, true, bytes);
      } catch (e) {
        // nothing reached the node: safe to place the sandbox elsewhere
        if (e instanceof GatewayError && e.code === "gateway.node_unreachable" && /refused|unreachable$/.test(e.message)) {
          this.log.warn({ nodeId: node.nodeId, err: e.message }, "create: node refused the connection; scheduling again");
          lastErr = e;
          continue;
        }
        throw e;
      }
      if (res.status === 404) {
        // templates are node-local: place the sandbox on a node that holds the template
        const text = await res.text();
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
    throw lastErr ?? new GatewayError("gateway.no_nodes", `no reachable node to create on (tried ${[...tried].join(", ")})`);
  }

  /** A node listing template `id` (id, alias or name), when a node's 404 says the template is missing there. */
  private async templateHolder(id: string, notFoundBody: string): Promise<NodeRef | null> {
    if (!id || !/template/.test(notFoundBody)) return null;
    const answers = await fanOut<{ templateID: string; aliases?: string[]; names?: string[] }[]>(await this.nodes(), "/templates", this.nodeKey, this.cfg.requestTimeoutMs);
    for (const a of answers) {
      if (a.ok && a.body.some((t) => t.templateID === id || t.aliases?.includes(id) || t.names?.includes(id))) return a.node;
    }
    return null;
  }

  /** A 201 create answer: our domain, the route cached, the binding recorded. */
  private async created(res: Response, node: NodeRef): Promise<Response> {
    const out = await this.withOurDomain(res);
    const id = out.body?.sandboxID;
    if (typeof id === "string") {
      this.routes.set(id, node);
      try {
        await this.scheduler.record(id, node);
      } catch (e) {
        // the node's next heartbeat roster binds it anyway; the route cache serves it meanwhile
        this.log.warn({ sandboxId: id, nodeId: node.nodeId, err: (e as Error).message }, "RecordAssignment failed");
      }
    }
    return out.res;
  }

  private async bySandbox(req: Request, url: URL, id: string, op: string | undefined, clientIp: string | null): Promise<Response> {
    const node = await this.resolve(id);
    if (!node) return gatewayError("gateway.sandbox_not_found", `sandbox "${id}" doesn't exist or you don't have access to it`);
    const res = await this.forward(req, url, node, clientIp, op !== undefined && SLOW_OPS.has(op));
    if (res.status === 404 && !op) this.routes.delete(id);
    if (req.method === "DELETE" && !op && (res.status === 204 || res.status === 404)) this.routes.delete(id);
    if ((op === "connect" || op === "resume") && (res.status === 200 || res.status === 201)) return (await this.withOurDomain(res)).res;
    return res;
  }

  /** GET /sandboxes/metrics?sandbox_ids=a,b: each id's node asked for its share. */
  private async metricsByIds(url: URL): Promise<Response> {
    const ids = (url.searchParams.get("sandbox_ids") ?? "").split(",").filter(Boolean);
    if (ids.length === 0 || ids.length > 100) return gatewayError("gateway.bad_request", "sandbox_ids must name 1 to 100 sandboxes");
    const byNode = new Map<string, { node: NodeRef; ids: string[] }>();
    for (const id of ids) {
      const n = await this.resolve(id);
      if (!n) continue;
      const e = byNode.get(n.nodeId) ?? { node: n, ids: [] };
      e.ids.push(id);
      byNode.set(n.nodeId, e);
    }
    const out: Record<string, unknown> = {};
    for (const { node, ids: mine } of byNode.values()) {
      const [a] = await fanOut<{ sandboxes?: Record<string, unknown> }>([node], `/sandboxes/metrics?sandbox_ids=${mine.join(",")}`, this.nodeKey, this.cfg.requestTimeoutMs);
      if (a?.ok) Object.assign(out, a.body.sandboxes ?? {});
    }
    return Response.json({ sandboxes: out });
  }

  private async template(req: Request, url: URL, id: string | null, clientIp: string | null): Promise<Response> {
    if (id === null || (req.method === "POST" && /^\/(v[23]\/)?templates$/.test(url.pathname))) {
      // a new template: built where Schedule places it
      const node = await this.scheduler.schedule({});
      return this.forward(req, url, node, clientIp, true);
    }
    const nodes = await this.nodes();
    const { holders } = await mergedList(nodes, "/templates", "templateID", this.nodeKey, this.cfg.requestTimeoutMs);
    let holder = holders.get(id)?.[0];
    if (!holder) {
      // aliases and build ids are not in the list: ask each node in turn
      for (const n of nodes) {
        const probe = await this.forward(new Request(req.url, { headers: req.headers }), new URL(`/templates/${encodeURIComponent(id)}`, url), n, clientIp, false).catch(() => null);
        if (probe && probe.status !== 404) {
          await probe.body?.cancel();
          holder = n;
          break;
        }
        await probe?.body?.cancel();
      }
    }
    if (!holder) return gatewayError("gateway.no_route", `template ${id} is not on any node`);
    return this.forward(req, url, holder, clientIp, req.method !== "GET");
  }

  /** GET /nodes: every node's own answer; an unreachable node from its last report. */
  private async listNodes(): Promise<Response> {
    const nodes = await this.nodes();
    const answers = await fanOut<Record<string, unknown>[]>(nodes, "/nodes", this.nodeKey, this.cfg.requestTimeoutMs);
    const observed = await this.scheduler.observed().catch(() => []);
    const out: Record<string, unknown>[] = [];
    for (const a of answers) {
      if (a.ok) out.push(...a.body);
      else {
        const o = observed.find((n) => n.nodeId === a.node.nodeId);
        out.push({ id: a.node.nodeId, nodeID: a.node.nodeId, serviceInstanceID: o?.serviceInstanceId ?? "", clusterID: o?.clusterId ?? "", status: "unhealthy", version: o?.version ?? "", commit: o?.commit ?? "", sandboxCount: o?.snapshot?.sandboxCount ?? 0, message: a.error });
      }
    }
    return Response.json(out);
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
    if (!node) return Response.json({ sandboxId: route.sandboxId, message: "The sandbox was not found", code: 502 }, { status: 502, headers: { "x-agentenv-error-source": "gateway" } });
    try {
      return await forwardToNode(req, node, { pathAndQuery: url.pathname + url.search, timeoutMs: this.cfg.requestTimeoutMs, set: routeHeaders(route), clientIp });
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

function dataError(sandboxId: string, e: unknown): Response {
  const status = e instanceof GatewayError && e.code === "gateway.scheduler_unavailable" ? 503 : 502;
  return Response.json({ sandboxId, message: (e as Error)?.message ?? String(e), code: status }, { status, headers: { "x-agentenv-error-source": "gateway" } });
}
