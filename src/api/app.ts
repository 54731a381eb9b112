/**
 * The node's REST API (Elysia): E2B's sandbox, template, node and health routes. Thin: each
 * route validates, calls the orchestrator, and maps the result to E2B's shapes and statuses.
 * Auth and the sandbox proxy sit in front of it (server.ts).
 */
import { Elysia, t } from "elysia";
import { openapi } from "@elysiajs/openapi";
import type { SandboxService, SandboxRecord } from "../orchestrator/index.ts";
import { ApiError } from "./errors.ts";
import { errorResponse, toErrorResponse } from "./status.ts";
import { refuseUnsupported, UNSUPPORTED } from "./unsupported.ts";
import { parseMetadataFilter } from "./metadata.ts";
import { renderPrometheus, renderSandboxMetrics } from "./prometheus.ts";
import { ksmGauges } from "../vmm/index.ts";
import { nodeInfo, type NodeIdentity } from "./node.ts";
import { CpuMeter } from "../ffi/cpu.ts";
import * as S from "./schemas.ts";
import { toDetail, toListed, toSandbox, toTemplate } from "./serialize.ts";
import { BodyPolicy, strictBody } from "./strict.ts";
import { healthBody, type Feature } from "./features.ts";
import { logger } from "../observability/log.ts";
import { malformedJsonMessage } from "../util/json-body.ts";
import { telemetryRoutes } from "./routes/telemetry.ts";
import { volumeRoutes } from "./routes/volumes.ts";
import { snapshotRoutes } from "./routes/snapshots.ts";
import pkg from "../../package.json" with { type: "json" };
import type { TemplateService } from "../template/index.ts";
import { templateRoutes } from "./routes/templates.ts";
import { eventRoutes } from "./routes/events.ts";
import type { EventsService } from "../events/index.ts";
import { secretRoutes, type SecretsBackend } from "./routes/secrets.ts";
import { TAKE_OVER_HEADER } from "../cluster/headers.ts";
// @ts-expect-error: a file asset (path string), embedded by `bun build --compile`
import scalarJs from "../../node_modules/@scalar/api-reference/dist/browser/standalone.js" with { type: "file" };
import { errorMessage } from "../util/error.ts";

/** What the routes need. */
export interface ApiDeps {
  orch: SandboxService;
  /** Domain returned to SDKs in `Sandbox.domain` (first `sandbox_proxy.domains` entry) or null. */
  domain: string | null;
  node: NodeIdentity;
  /** Serve /openapi.json and /docs. */
  docs: boolean;
  /** Template builds (routes under /v3/templates, /templates/...); absent: not served. */
  templates?: TemplateService;
  /** `[api] strict_bodies`: refuse unknown body fields (default true) or ignore and log them. */
  strictBodies?: boolean;
  /** Lifecycle events and webhooks (routes under /events); absent: not served. */
  events?: EventsService;
  /** The `/secrets` routes' store (or the gateway that keeps it); absent: not served. */
  secrets?: SecretsBackend;
}

/** Optional E2B features every node serves (GET /health); the app adds those of its deps. */
const NODE_FEATURES: Feature[] = [
  "sandboxes.v2",
  "sandboxes.list.v2",
  "pause.memory",
  "pause.filesystem",
  "auto_resume",
  "network.egress",
  "network.update",
  "network.rules",
  "network.egress_proxy",
  "network.mask_request_host",
  "snapshots",
  "fork",
  "volumes",
  "metrics",
  "logs",
];

/** Paths served without an API key. */
export const PUBLIC_PATHS = [/^\/health$/, /^\/metrics$/, /^\/openapi\.json$/, /^\/docs(\/.*)?$/, /^\/_assets\//];
/**
 * Paths whose routes check their own credentials instead of the API key (the volume content API
 * takes the volume's bearer token) and stream their bodies (no `max_body_bytes` bound).
 */
export const SELF_AUTH_PATHS = [/^\/volumecontent\//];

const ERR = { 400: S.ErrorBody, 401: S.ErrorBody, 404: S.ErrorBody, 409: S.ErrorBody, 500: S.ErrorBody };
const noContent = () => new Response(null, { status: 204 });

function validationMessage(error: unknown): string {
  const e = error as { all?: { path?: string; message?: string }[]; message?: string };
  const first = e.all?.[0];
  if (first) return `invalid request: ${first.path ? first.path.replace(/^\//, "") + ": " : ""}${first.message}`;
  return `invalid request: ${e.message ?? "validation failed"}`;
}

function parseList(query: Record<string, string | undefined>) {
  let states: ("running" | "paused")[] | undefined;
  if (query.state) {
    states = [];
    for (const s of query.state.split(",")) {
      if (s !== "running" && s !== "paused") throw new ApiError("api.bad_state", `invalid state ${JSON.stringify(s)}: expected running or paused`, { state: s });
      states.push(s);
    }
  }
  let limit = 100;
  if (query.limit !== undefined) {
    limit = Number(query.limit);
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw new ApiError("api.bad_limit", `limit must be between 1 and 100, got ${query.limit}`, { limit: query.limit });
  }
  let startedAfter: number | undefined;
  if (query.startedAfter) {
    startedAfter = Date.parse(query.startedAfter);
    if (Number.isNaN(startedAfter)) throw new ApiError("api.bad_time", `startedAfter must be RFC 3339, got ${query.startedAfter}`, { startedAfter: query.startedAfter });
  }
  const order = query.order as "asc" | "desc" | undefined;
  return {
    states,
    limit,
    startedAfter,
    order,
    template: query.template,
    nextToken: query.nextToken,
    metadata: query.metadata !== undefined ? parseMetadataFilter(query.metadata) : undefined,
  };
}

/** Build the Elysia app. Not listening: server.ts wraps its `fetch`. */
export function buildApp(deps: ApiDeps) {
  const { orch, domain } = deps;
  const cpu = new CpuMeter(); // GET /nodes: host CPU since the previous GET
  const bodies = new BodyPolicy(deps.strictBodies ?? true, logger("api"));
  const health = healthBody(pkg.version, bodies.strict, [
    ...NODE_FEATURES,
    ...(deps.templates ? (["templates.build"] as const) : []),
    ...(deps.events ? (["events", "webhooks"] as const) : []),
    ...(deps.secrets ? (["secrets"] as const) : []),
  ]);
  const created = (r: SandboxRecord, set: { status?: number | string }) => {
    set.status = 201;
    return toSandbox(r, domain);
  };
  const create = (body: typeof S.NewSandbox.static, secure: boolean) => {
    refuseUnsupported(body, UNSUPPORTED.create);
    return orch.create({
      template: body.templateID,
      timeoutSecs: body.timeout,
      autoPause: body.autoPause,
      autoPauseMemory: body.autoPauseMemory,
      autoResume: body.autoResume?.enabled,
      metadata: body.metadata ?? undefined,
      envVars: body.envVars ?? undefined,
      secure,
      allowInternetAccess: body.allow_internet_access,
      network: (body.network as Record<string, unknown> | null | undefined) ?? undefined,
      cpuCount: body.cpuCount,
      memoryMB: body.memoryMB,
      volumeMounts: body.volumeMounts,
    });
  };

  const root = new Elysia({ normalize: false });
  if (deps.docs) {
    root
      .get("/_assets/scalar.js", () => new Response(Bun.file(scalarJs), { headers: { "content-type": "text/javascript; charset=utf-8", "cache-control": "public, max-age=86400" } }), {
        detail: { hide: true },
      })
      .use(
        openapi({
          path: "/docs",
          specPath: "/openapi.json",
          // no third-party fetches from the explorer: bundle served here, system fonts instead of
          // fonts.scalar.com, requests sent straight to this node (no proxy.scalar.com)
          scalar: { cdn: "/_assets/scalar.js", withDefaultFonts: false, proxyUrl: "", externalUrls: { proxyUrl: "" } } as never,
          exclude: { paths: ["/_assets/scalar.js"] },
          documentation: {
            info: { title: "AgentENV node API", version: pkg.version, description: "E2B-compatible sandbox API. Authenticate with the X-API-Key header. Sandbox ports are proxied on the same origin (headers E2b-Sandbox-Id + E2b-Sandbox-Port, hosts {port}-{id}.{domain}, or /proxy/{id}/{port}/...)." },
            components: { securitySchemes: { ApiKeyAuth: { type: "apiKey", in: "header", name: "X-API-Key" } } },
            security: [{ ApiKeyAuth: [] }],
          },
        }),
      );
  }
  const app = root
    .onError(({ code, error }) => {
      if (code === "VALIDATION") return errorResponse("api.validation", validationMessage(error));
      if (code === "PARSE") {
        // JSON routes read their own bodies (strict.ts readJsonBody): its ApiError is the cause
        if (error.cause instanceof ApiError) return toErrorResponse(error.cause);
        return errorResponse("api.parse", malformedJsonMessage(errorMessage(error.cause ?? error)));
      }
      if (code === "NOT_FOUND") return errorResponse("api.no_route", "no such route");
      return toErrorResponse(error);
    })
    .get("/health", () => health, { detail: { summary: "Health, version and the optional E2B features this node serves", tags: ["node"] } })
    .use(telemetryRoutes(orch))
    .use(volumeRoutes(orch, bodies))
    .use(snapshotRoutes(orch, domain, bodies))
    .get(
      "/metrics",
      async () => {
        // the scrape is the sampling clock of the sandbox gauges: fresh samples, no watching
        const running = orch.inStates(["running"]).map((r) => r.id);
        await orch.watchMetrics(running, false);
        return new Response(
          renderPrometheus(orch.getCounters(), { agentenv_uptime_seconds: { value: Math.round(process.uptime()), help: "Seconds since the node process started." }, ...ksmGauges() }) +
            renderSandboxMetrics(orch.latestMetrics(running)),
          {
            headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
          },
        );
      },
      { detail: { summary: "Prometheus metrics (sandbox counters, per-sandbox resource gauges)", tags: ["node"] } },
    )
    .post("/v2/sandboxes", async ({ body, set }) => created(await create(body, true), set), {
      ...strictBody(bodies, S.NewSandboxV2),
      response: { 201: S.Sandbox, ...ERR },
      detail: { summary: "Create a sandbox (E2B SDK >= 2.46)", tags: ["sandboxes"] },
    })
    .post("/sandboxes", async ({ body, set }) => created(await create(body, body.secure === true), set), {
      ...strictBody(bodies, S.NewSandbox),
      response: { 201: S.Sandbox, ...ERR },
      detail: { summary: "Create a sandbox (v1; Python SDK, older JS SDK)", tags: ["sandboxes"] },
    })
    .get(
      "/v2/sandboxes",
      ({ query, set }) => {
        const q = parseList(query);
        const page = orch.list(q);
        set.headers["x-total-running"] = String(orch.runningCount());
        if (page.nextToken) set.headers["x-next-token"] = page.nextToken;
        return page.items.map(toListed);
      },
      { query: S.ListQuery, response: { 200: t.Array(S.ListedSandbox), ...ERR }, detail: { summary: "List sandboxes (filters, pagination)", tags: ["sandboxes"] } },
    )
    .get(
      "/sandboxes",
      ({ query }) => {
        const q = parseList({ metadata: query.metadata });
        const out: SandboxRecord[] = [];
        let token: string | undefined;
        do {
          const page = orch.list({ ...q, states: ["running"], nextToken: token });
          out.push(...page.items);
          token = page.nextToken;
        } while (token);
        return out.map(toListed);
      },
      { query: t.Object({ metadata: t.Optional(t.String()) }), response: { 200: t.Array(S.ListedSandbox), ...ERR }, detail: { summary: "List running sandboxes (deprecated)", tags: ["sandboxes"] } },
    )
    .get("/sandboxes/:sandboxID", ({ params }) => toDetail(orch.get(params.sandboxID), domain), {
      response: { 200: S.SandboxDetail, ...ERR },
      detail: { summary: "Get a sandbox", tags: ["sandboxes"] },
    })
    .delete(
      "/sandboxes/:sandboxID",
      async ({ params }) => {
        await orch.kill(params.sandboxID);
        return noContent();
      },
      { detail: { summary: "Kill a sandbox", tags: ["sandboxes"] } },
    )
    .post(
      "/sandboxes/:sandboxID/timeout",
      async ({ params, body }) => {
        await orch.setTimeout(params.sandboxID, body.timeout);
        return noContent();
      },
      { ...strictBody(bodies, S.SandboxTimeout), detail: { summary: "Set the sandbox timeout (from now)", tags: ["sandboxes"] } },
    )
    .post(
      "/sandboxes/:sandboxID/refreshes",
      async ({ params, body }) => {
        await orch.refresh(params.sandboxID, body?.duration ?? 15);
        return noContent();
      },
      { ...strictBody(bodies, t.Optional(S.SandboxRefresh)), detail: { summary: "Keep a sandbox alive a while longer", tags: ["sandboxes"] } },
    )
    .post(
      "/sandboxes/:sandboxID/pause",
      async ({ params, body }) => {
        await orch.pause(params.sandboxID, { memory: body?.memory });
        return noContent();
      },
      { ...strictBody(bodies, t.Optional(S.PauseBody)), detail: { summary: "Pause (snapshot) a sandbox", tags: ["sandboxes"] } },
    )
    .post(
      "/sandboxes/:sandboxID/resume",
      async ({ params, body, set, request }) => {
        refuseUnsupported(body, UNSUPPORTED.resume);
        return created(await orch.resume(params.sandboxID, body?.timeout, { memory: body?.memory, fromStore: request.headers.has(TAKE_OVER_HEADER) }), set);
      },
      { ...strictBody(bodies, t.Optional(S.ResumedSandbox)), response: { 201: S.Sandbox, ...ERR }, detail: { summary: "Resume a paused sandbox (deprecated; use connect)", tags: ["sandboxes"] } },
    )
    .post(
      "/v2/sandboxes/:sandboxID/connect",
      async ({ params, body, set, request }) => {
        const r = await orch.connect(params.sandboxID, body?.timeout, { memory: body?.memory, fromStore: request.headers.has(TAKE_OVER_HEADER) });
        set.status = r.resumed ? 201 : 200;
        return toSandbox(r.sandbox, domain);
      },
      { ...strictBody(bodies, t.Optional(S.ConnectSandboxV2)), response: { 200: S.Sandbox, 201: S.Sandbox, ...ERR }, detail: { summary: "Connect to a sandbox, resuming it if paused", tags: ["sandboxes"] } },
    )
    .post(
      "/sandboxes/:sandboxID/connect",
      async ({ params, body, set, request }) => {
        const r = await orch.connect(params.sandboxID, body.timeout, { memory: body.memory, fromStore: request.headers.has(TAKE_OVER_HEADER) });
        set.status = r.resumed ? 201 : 200;
        return toSandbox(r.sandbox, domain);
      },
      { ...strictBody(bodies, S.ConnectSandbox), response: { 200: S.Sandbox, 201: S.Sandbox, ...ERR }, detail: { summary: "Connect to a sandbox (v1)", tags: ["sandboxes"] } },
    )
    .put(
      "/sandboxes/:sandboxID/network",
      async ({ params, body }) => {
        await orch.updateNetwork(params.sandboxID, body as Record<string, unknown>);
        return noContent();
      },
      { ...strictBody(bodies, S.SandboxNetworkUpdate), detail: { summary: "Replace a running sandbox's egress policy", tags: ["sandboxes"] } },
    )
    .get("/templates", async () => (await orch.listTemplates()).map(toTemplate), {
      response: { 200: t.Array(S.Template), ...ERR },
      detail: { summary: "List templates", tags: ["templates"] },
    })
    .get("/v2/templates", async () => (await orch.listTemplates()).map(toTemplate), {
      response: { 200: t.Array(S.Template), ...ERR },
      detail: { summary: "List templates", tags: ["templates"] },
    })
    .get("/nodes", async () => [await nodeInfo(deps.node, orch, cpu)], { response: { 200: t.Array(S.Node), ...ERR }, detail: { summary: "List nodes (this node)", tags: ["nodes"] } })
    .get(
      "/nodes/:nodeID",
      ({ params }) => {
        if (params.nodeID !== deps.node.id) throw new ApiError("api.node_not_found", `node ${params.nodeID} not found`, { nodeID: params.nodeID });
        return nodeInfo(deps.node, orch, cpu);
      },
      { response: { 200: S.Node, ...ERR }, detail: { summary: "Get a node", tags: ["nodes"] } },
    );
  if (deps.templates) app.use(templateRoutes(deps.templates, orch, bodies));
  if (deps.events) app.use(eventRoutes(deps.events, bodies));
  if (deps.secrets) app.use(secretRoutes(deps.secrets));

  return app;
}
