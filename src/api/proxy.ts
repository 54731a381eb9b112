/**
 * The sandbox proxy, on the API origin (so E2B_SANDBOX_URL may equal E2B_API_URL). A request
 * is for a sandbox when it carries `E2b-Sandbox-Id` (+ `E2b-Sandbox-Port`) or
 * `x-agentenv-sandbox-id` (+ optional `x-agentenv-sandbox-port`, or upstream AgentENV's
 * `x-agentenv-target-port`; port headers that disagree are a 400), when its Host is
 * `{port}-{id}.{domain}` for a configured domain, or when its path is `/proxy/{id}/{port}/...`.
 * Routing facts: e2b-dev/infra packages/shared/pkg/proxy/host.go (via e2b-contract.md §1.3).
 * HTTP bodies stream both ways; WebSocket is relayed frame by frame (server.ts).
 * Unknown sandbox or closed port: 502 `{sandboxId, message, code: 502}`.
 */
import type { Logger } from "pino";
import { ENVD_PORT } from "../envd/version.ts";
import { fileSignature, SIGNATURE_EXPIRED, tokensEqual } from "../envd/signature.ts";
import { logger } from "../observability/log.ts";
import { OrchestratorError, type SandboxService } from "../orchestrator/index.ts";
import { maskedHost } from "../net/index.ts";
import { RouteTable, TRANSITIONAL } from "./route-table.ts";
import { headerPort, parsePort, PORT_HEADERS } from "./sandbox-port.ts";
import { errorResponse } from "./status.ts";
import { upstreamFailure, Watchdog, watchedBody } from "./upstream.ts";
import { errorMessage } from "../util/error.ts";

/** Header carrying a sandbox's traffic access token (E2B). */
export const TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token";
/** envd routes only the host may call (e2b-contract.md §3.2). */
export const ENVD_INTERNAL = new Set(["/init", "/freeze", "/unfreeze", "/collapse", "/fsfreeze", "/fsthaw", "/upgrade"]);
const HOP = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host", "proxy-authorization", "proxy-authenticate"];
const ROUTING = ["e2b-sandbox-id", "x-agentenv-sandbox-id", ...PORT_HEADERS];

/** A request's target inside a sandbox. */
export interface ProxyRoute {
  sandboxId: string;
  port: number;
  /** Path + query to send upstream. */
  pathAndQuery: string;
}

export interface ProxyOptions {
  /** Host suffixes for `{port}-{id}.{domain}` routing. */
  domains: string[];
  /** Bound on connecting with a request body: until the upstream reads it, ms (without `responseTimeoutMs`, also a bodyless request's wait for response headers). */
  connectTimeoutMs: number;
  /** Once the body streams: longest pause between its chunks (without `responseTimeoutMs`, also from its end to the response headers), ms. */
  idleTimeoutMs: number;
  /**
   * Longest wait for response headers once the request is sent, ms: from the body's end, or for a
   * request without a body from its start (connecting included). Absent: as above.
   */
  responseTimeoutMs?: number;
  /** Refuse ENVD_INTERNAL paths on the envd port. */
  blockEnvdInternal: boolean;
  /** Longest wait for a sandbox that is being created, paused or resumed to settle before a request is routed, ms. */
  settleTimeoutMs: number;
}

/** A 502 as the E2B edge proxy answers it. */
export function badGateway(sandboxId: string, message: string): Response {
  return Response.json({ sandboxId, message, code: 502 }, { status: 502, headers: { [ERROR_SOURCE]: "proxy" } });
}

/**
 * Header on every error the node's proxy answers by itself (`proxy`); an error status without it
 * came from the sandbox (envd or the guest's own server) and was passed through.
 */
export const ERROR_SOURCE = "x-agentenv-error-source";

/** Largest upstream 5xx body the proxy reads to log it (bytes); larger ones are relayed unread. */
const LOGGED_BODY_MAX = 64 * 1024;

/**
 * Decide whether `req` is for a sandbox.
 * @returns the route, null when the request is for the API, or a 400 Response for a routing
 *   header with a bad port.
 */
export function routeOf(req: Request, url: URL, domains: string[]): ProxyRoute | Response | null {
  const h = req.headers;
  const id = h.get("e2b-sandbox-id") ?? h.get("x-agentenv-sandbox-id");
  const pathAndQuery = url.pathname + url.search;
  if (id !== null) {
    const port = headerPort(h);
    if (typeof port !== "number") return errorResponse("api.validation", port.error, { [ERROR_SOURCE]: "proxy" });
    return { sandboxId: id, port, pathAndQuery };
  }
  const host = (h.get("host") ?? url.host).replace(/:\d+$/, "").toLowerCase();
  for (const d of domains) {
    const suffix = "." + d.toLowerCase();
    if (!host.endsWith(suffix)) continue;
    const label = host.slice(0, -suffix.length);
    const m = /^([0-9]{1,5})-([a-z0-9]+)$/.exec(label);
    if (!m) continue;
    const port = parsePort(m[1]!);
    if (port === null) continue;
    return { sandboxId: m[2]!, port, pathAndQuery };
  }
  const p = /^\/proxy\/([a-z0-9]+)\/([0-9]{1,5})(\/.*)?$/.exec(url.pathname);
  if (p) {
    const port = parsePort(p[2]!);
    if (port === null) return errorResponse("api.validation", `invalid sandbox port ${p[2]}`, { [ERROR_SOURCE]: "proxy" });
    return { sandboxId: p[1]!, port, pathAndQuery: (p[3] ?? "/") + url.search };
  }
  return null;
}

/**
 * Forwarding of HTTP requests to sandbox ports. Connections in flight are tracked per sandbox
 * and cut when it is killed, paused or fails: a client streaming from a sandbox that goes away
 * sees its stream end at once instead of hanging until a timeout.
 */
export class SandboxProxy {
  private readonly log: Logger = logger("sandbox_proxy");
  private readonly active = new Map<string, Set<() => void>>();
  private readonly unobserve: () => void;
  /** Live sandboxes' routes, kept by the service's state events. */
  readonly routes: RouteTable;

  constructor(private readonly sandboxes: SandboxService, readonly opts: ProxyOptions) {
    this.routes = new RouteTable(sandboxes);
    this.unobserve = sandboxes.observe({
      onEvent: (e) => {
        if (e.to === "killing" || e.to === "pausing" || e.to === "failed") this.cut(e.id);
      },
    });
  }

  /**
   * Register a connection to sandbox `id`; `close` is called if the sandbox goes away.
   * @returns the function that unregisters it (call when the connection ends).
   */
  track(id: string, close: () => void): () => void {
    let set = this.active.get(id);
    if (!set) this.active.set(id, (set = new Set()));
    set.add(close);
    return () => {
      set.delete(close);
      if (set.size === 0 && this.active.get(id) === set) this.active.delete(id);
    };
  }

  /** Close every tracked connection of sandbox `id`. */
  cut(id: string): void {
    const set = this.active.get(id);
    if (!set) return;
    this.active.delete(id);
    for (const close of set) {
      try {
        close();
      } catch (e) {
        this.log.debug({ sandboxId: id, err: e }, "closing a proxied connection failed");
      }
    }
  }

  /** Stop observing the orchestrator and cut every connection. */
  close(): void {
    this.unobserve();
    this.routes.close();
    for (const id of [...this.active.keys()]) this.cut(id);
  }

  /**
   * A signed file URL (`/files?...&signature=...`, as `Sandbox.uploadUrl()` / `downloadUrl()` give
   * them when E2B_SANDBOX_URL is the node) carries no sandbox id: it is routed to the sandbox whose
   * envd access token produced the signature (every live sandbox's is compared, in constant time).
   * envd checks the signature again.
   * @returns the route to envd, null when `req` is not a signed /files request, or a 401 Response
   *   naming why (no sandbox's token produced it, a malformed expiration, or expired: E2B's envd
   *   answers 401 "signature is already expired", which SDK users see as the message).
   */
  signedFileRoute(req: Request, url: URL): ProxyRoute | Response | null {
    const sig = url.searchParams.get("signature");
    if (url.pathname !== "/files" || sig === null) return null;
    const op = req.method === "GET" || req.method === "HEAD" ? "read" : "write";
    const refuse = (status: 401, message: string) => Response.json({ code: status, message }, { status, headers: { [ERROR_SOURCE]: "proxy" } });
    const expRaw = url.searchParams.get("signature_expiration");
    const exp = expRaw === null ? undefined : Number(expRaw);
    if (exp !== undefined && !Number.isSafeInteger(exp)) return refuse(401, `invalid signature_expiration ${JSON.stringify(expRaw)}: expected unix seconds`);
    const path = url.searchParams.get("path") ?? "";
    const user = url.searchParams.get("username") ?? "";
    let found: string | null = null;
    for (const r of this.routes.values()) {
      // every token is compared (no early exit), so timing does not tell which one matched
      if (r.envdAccessToken && tokensEqual(fileSignature(path, op, user, r.envdAccessToken, exp), sig) && found === null) found = r.id;
    }
    if (found === null) return refuse(401, `invalid file signature: no sandbox's access token signs ${op} of ${JSON.stringify(path)} for user ${JSON.stringify(user)}${exp === undefined ? "" : ` until ${exp}`}`);
    if (exp !== undefined && exp < Date.now() / 1000) return refuse(401, SIGNATURE_EXPIRED);
    return { sandboxId: found, port: ENVD_PORT, pathAndQuery: url.pathname + url.search };
  }

  /**
   * Where a route goes: `host:port` of a running sandbox, from the in-memory route table (no
   * database read). A sandbox being created, paused or resumed is waited for (up to
   * `settleTimeoutMs`, woken by its state event): traffic racing a resume (another request's
   * autoResume, a connect) is not refused with "not found". A paused sandbox with autoResume is
   * resumed first; one without answers 502 saying it is paused and how to resume it.
   * Ports other than envd's of a sandbox created with `network.allowPublicTraffic=false` need
   * header `e2b-traffic-access-token` equal to its `trafficAccessToken` (E2B proxy rule).
   * @param headers the client's request headers (for the traffic access token).
   * @returns the upstream origin, or a 502/403 Response.
   */
  async target(route: ProxyRoute, headers: Headers): Promise<string | Response> {
    const id = route.sandboxId;
    let r = this.routes.get(id);
    const token = route.port === ENVD_PORT ? null : r?.trafficAccessToken;
    if (token && headers.get(TRAFFIC_TOKEN_HEADER) !== token) {
      return Response.json(
        { sandboxId: id, code: 403, message: `port ${route.port} of sandbox ${id} is private: send header ${TRAFFIC_TOKEN_HEADER} with the sandbox's trafficAccessToken` },
        { status: 403, headers: { [ERROR_SOURCE]: "proxy" } },
      );
    }
    if (this.opts.blockEnvdInternal && route.port === ENVD_PORT && ENVD_INTERNAL.has(route.pathAndQuery.split("?")[0]!)) {
      return Response.json({ code: 403, message: `path ${route.pathAndQuery.split("?")[0]} is not reachable through the proxy` }, { status: 403 });
    }
    try {
      if (r && TRANSITIONAL.has(r.state)) r = await this.routes.settled(id, this.opts.settleTimeoutMs);
      // E2B: traffic never cold-boots a sandbox: a filesystem-only snapshot waits for a connect
      if (r?.state === "paused" && r.autoResume && r.snapshotKind !== "filesystem") {
        await this.sandboxes.connect(id);
        r = this.routes.get(id);
      }
    } catch (e) {
      if (e instanceof OrchestratorError && e.code === "orchestrator.not_found") return badGateway(id, "The sandbox was not found");
      this.log.error({ sandboxId: id, port: route.port, path: route.pathAndQuery, err: e }, "proxy: cannot route to the sandbox");
      return badGateway(id, `cannot route to the sandbox: ${errorMessage(e)}`);
    }
    if (r?.state === "paused" && r.snapshotKind === "filesystem") {
      return badGateway(id, `The sandbox ${id} is paused without its memory (a filesystem-only snapshot); traffic does not resume it: connect to it first (POST /sandboxes/${id}/connect)`);
    }
    if (r?.state === "paused") {
      return badGateway(id, `The sandbox ${id} is paused: resume it with Sandbox.connect() (POST /sandboxes/${id}/connect), or create it with autoResume so traffic resumes it`);
    }
    if (!r || r.state !== "running" || !r.host) return badGateway(id, r && TRANSITIONAL.has(r.state) ? `The sandbox is still ${r.state}` : "The sandbox was not found");
    return `${r.host.includes(":") ? `[${r.host}]` : r.host}:${route.port}`;
  }

  /**
   * Forward `req` to `route`, streaming the request and response bodies. An upstream 5xx is
   * logged with its body (when small); a failure of the proxy itself is a 500 JSON
   * `{sandboxId, message, code: 500}` with `x-agentenv-error-source: proxy`, logged too.
   */
  async forward(req: Request, route: ProxyRoute, clientIp: string | null): Promise<Response> {
    try {
      return await this.forwardUnsafe(req, route, clientIp);
    } catch (e) {
      this.log.error({ sandboxId: route.sandboxId, port: route.port, path: route.pathAndQuery, err: e }, "proxy: forwarding failed");
      return Response.json(
        { sandboxId: route.sandboxId, message: `the node's proxy failed forwarding to port ${route.port}: ${errorMessage(e)}`, code: 500 },
        { status: 500, headers: { [ERROR_SOURCE]: "proxy" } },
      );
    }
  }

  /**
   * How the node speaks to `route`'s port: `https` for the sandbox's `httpsPorts` (its certificate
   * is not verified, as E2B's edge does), and the Host to send (`maskRequestHost` with `${PORT}`
   * replaced), or null for the node's own.
   */
  upstreamOf(route: ProxyRoute): { scheme: "http" | "https"; host: string | null } {
    const r = this.routes.get(route.sandboxId);
    return { scheme: r?.httpsPorts.includes(route.port) ? "https" : "http", host: r?.maskRequestHost ? maskedHost(r.maskRequestHost, route.port) : null };
  }

  private async forwardUnsafe(req: Request, route: ProxyRoute, clientIp: string | null): Promise<Response> {
    const target = await this.target(route, req.headers);
    if (target instanceof Response) return target;
    const headers = new Headers(req.headers);
    for (const n of HOP) headers.delete(n);
    for (const n of ROUTING) headers.delete(n);
    if (clientIp) headers.set("x-forwarded-for", clientIp);
    const up = this.upstreamOf(route);
    if (up.host) headers.set("host", up.host);
    const ctl = new AbortController();
    const untrack = this.track(route.sandboxId, () => ctl.abort(new Error(`sandbox ${route.sandboxId} went away`)));
    ctl.signal.addEventListener("abort", untrack, { once: true });
    const onClientAbort = () => ctl.abort(req.signal.reason);
    req.signal.addEventListener("abort", onClientAbort, { once: true });
    const dog = new Watchdog(ctl);
    const hasBody = req.method !== "GET" && req.method !== "HEAD" && req.body !== null;
    const answerMs = this.opts.responseTimeoutMs;
    const firstMs = hasBody ? this.opts.connectTimeoutMs : (answerMs ?? this.opts.connectTimeoutMs);
    dog.arm(firstMs, hasBody ? `not connected within ${firstMs} ms` : `no response within ${firstMs} ms`);
    let res: Response;
    try {
      res = await fetch(`${up.scheme}://${target}${route.pathAndQuery}`, {
        method: req.method,
        headers,
        ...(up.scheme === "https" ? { tls: { rejectUnauthorized: false } } : {}),
        body: hasBody ? watchedBody(req.body!, dog, this.opts.idleTimeoutMs, answerMs) : undefined,
        redirect: "manual",
        decompress: false,
        duplex: "half",
        signal: ctl.signal,
      } as RequestInit);
    } catch (e) {
      untrack();
      this.log.debug({ sandboxId: route.sandboxId, port: route.port, err: e }, "upstream unreachable");
      const why = upstreamFailure(e, ctl.signal);
      return badGateway(route.sandboxId, ctl.signal.aborted ? `The request to port ${route.port} of the sandbox was cut: ${why}` : `The sandbox is running but port ${route.port} is not open: ${why}`);
    } finally {
      dog.clear();
    }
    const rh = new Headers(res.headers);
    for (const n of HOP) rh.delete(n);
    if (res.status >= 500 && res.body) {
      const len = Number(res.headers.get("content-length") ?? NaN);
      if (Number.isFinite(len) && len <= LOGGED_BODY_MAX) {
        let body: Uint8Array;
        try {
          body = new Uint8Array(await res.arrayBuffer());
        } catch (e) {
          untrack();
          this.log.warn({ sandboxId: route.sandboxId, port: route.port, path: route.pathAndQuery, status: res.status, err: e }, "proxy: the sandbox answered an error and its body broke off");
          return badGateway(route.sandboxId, `The sandbox answered ${res.status} and its body broke off: ${upstreamFailure(e, ctl.signal)}`);
        }
        untrack();
        this.log.warn({ sandboxId: route.sandboxId, port: route.port, method: req.method, path: route.pathAndQuery, status: res.status, body: new TextDecoder().decode(body.subarray(0, 2048)) }, "proxy: the sandbox answered an error");
        return new Response(body, { status: res.status, statusText: res.statusText, headers: rh });
      }
      this.log.warn({ sandboxId: route.sandboxId, port: route.port, method: req.method, path: route.pathAndQuery, status: res.status }, "proxy: the sandbox answered an error");
    }
    if (!res.body) {
      untrack();
      return new Response(null, { status: res.status, statusText: res.statusText, headers: rh });
    }
    return new Response(relay(res.body, untrack, ctl), { status: res.status, statusText: res.statusText, headers: rh });
  }
}


/**
 * Relay an upstream body chunk by chunk (no buffering). When the upstream read fails (the
 * sandbox was cut, paused or killed, or its connection broke) the relayed stream fails too, and
 * Bun.serve then resets the client's connection: a cut body is never taken for a whole one (a
 * chunked response gets no last chunk; the E2B SDK reads "the socket connection was closed
 * unexpectedly", which it reports as the sandbox gone). The stream fails with `undefined`: an
 * Error value would be printed by Bun on stderr, once per cut request.
 * Bun.serve sends every streamed body chunked, so the upstream's Content-Length is not kept.
 */
function relay(upstream: ReadableStream<Uint8Array>, done: () => void, ctl: AbortController): ReadableStream<Uint8Array> {
  const reader = upstream.getReader();
  return new ReadableStream<Uint8Array>(
    {
      async pull(c) {
        let r: Awaited<ReturnType<typeof reader.read>>;
        try {
          r = await reader.read();
        } catch {
          done();
          return c.error(undefined);
        }
        if (r.done) {
          done();
          return c.close();
        }
        c.enqueue(r.value);
      },
      cancel(reason) {
        done();
        ctl.abort(reason);
      },
    },
    { highWaterMark: 0 },
  );
}
