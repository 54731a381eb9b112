/**
 * The node's HTTP listener: one Bun.serve in front of the Elysia app that (1) sends sandbox
 * traffic to the proxy (HTTP and WebSocket), (2) checks X-API-Key, (3) hands the rest to the
 * API. idleTimeout 0: envd streams (process output, watches) may be silent for long.
 */
import type { Server } from "bun";
import { logger } from "../observability/log.ts";
import { PUBLIC_PATHS, SELF_AUTH_PATHS } from "./app.ts";
import { keyMatches } from "./auth.ts";
import { errorResponse, toErrorResponse } from "./status.ts";
import { badGateway, routeOf, type SandboxProxy } from "./proxy.ts";
import { relayData, wsRelay, type RelayData } from "./ws-relay.ts";
import { ConsoleSite, TerminalService, withTerminals, type EnvdLookup, type TerminalWsData } from "../console/index.ts";
import { ENVD_PORT } from "../envd/version.ts";
import type { Config } from "../config/index.ts";

/** Anything with a fetch handler (the Elysia app). */
export interface FetchApp {
  handle(req: Request): Promise<Response> | Response;
}

export interface ServeOptions {
  hostname: string;
  port: number;
  apiKey: string;
  /** Null while the node is still starting (the address is bound first): every request gets 503. */
  app: FetchApp | null;
  proxy: SandboxProxy | null;
  /** Largest API request body, bytes (proxied bodies are not bounded). */
  maxBodyBytes: number;
  /**
   * Requests authorised by their URL instead of the API key, with bodies bounded by their own
   * handler (template file uploads): a Response, or null when `req` is not one of them.
   */
  direct?: ((req: Request, url: URL) => Promise<Response | null>) | null;
  /** The console's settings (`/console/` when enabled; sandbox terminals always). */
  console: Config["console"];
}

interface WsData extends RelayData {
  sandboxId: string;
}

const log = logger("api");

/** The 401 answer's message: the same for a missing and a wrong key, naming nothing of the server. */
export const UNAUTHORIZED_MESSAGE = "Invalid API key: send this node's key in the X-API-Key header";

/** Parse `host:port` (IPv6 in brackets). @throws Error naming the bad value. */
export function parseAddr(addr: string): { hostname: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(addr);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new Error(`invalid listen address ${JSON.stringify(addr)}: expected host:port`);
  return { hostname: m[1] ?? (m[2] || "0.0.0.0"), port };
}

/** Where a listener binds; `tls` (PEM certificate chain and key) makes it HTTPS. */
export interface ListenOptions {
  hostname: string;
  port: number;
  tls?: { cert: string; key: string };
}

/**
 * Start listening. `o` is read on every request, so a caller may bind early with `app`/`proxy`
 * null and fill them in once ready; several listeners (HTTP, HTTPS) may share one `o`. Stop with
 * `server.stop(true)`.
 * @param listen the address (and TLS) of this listener; default `o`'s hostname and port, plain HTTP.
 * @throws Error (EADDRINUSE, EACCES, a bad certificate) when the listener cannot start.
 */
export function serve(o: ServeOptions, listen: ListenOptions = o): Server<WsData | TerminalWsData> {
  const cc = o.console;
  const site = cc.enabled ? new ConsoleSite({ role: "node", refreshMs: cc.refresh_ms }) : null;
  site?.preload();
  const terminals = new TerminalService({ ticketTtlMs: cc.ticket_ttl_ms, maxTerminals: cc.max_terminals, authTimeoutMs: cc.auth_timeout_ms, bufferBytes: cc.buffer_bytes }, (id) => envdOf(o.proxy, id));
  return Bun.serve<WsData | TerminalWsData>({
    hostname: listen.hostname,
    port: listen.port,
    ...(listen.tls ? { tls: listen.tls } : {}),
    idleTimeout: 0,
    maxRequestBodySize: Number.MAX_SAFE_INTEGER,
    // a throw escaping fetch below: JSON naming the failure (Bun's default is an anonymous 500)
    error(err) {
      log.error({ err }, "request handler failed");
      return errorResponse("api.internal", `the node failed handling the request: ${err?.message ?? String(err)}`);
    },
    async fetch(req, server) {
      if (!o.app || !o.proxy) return errorResponse("api.starting", "the node is starting, try again shortly", { "retry-after": "1" });
      const { app, proxy } = o;
      const url = new URL(req.url);
      const route = routeOf(req, url, proxy.opts.domains) ?? proxy.signedFileRoute(req, url);
      if (route instanceof Response) return route;
      const ip = server.requestIP(req)?.address ?? null;
      if (route) {
        if (req.headers.get("upgrade")?.toLowerCase() === "websocket") {
          const target = await proxy.target(route, req.headers);
          if (target instanceof Response) return target;
          const headers: Record<string, string> = {};
          for (const n of ["x-access-token", "authorization", "cookie", "origin", "user-agent"]) {
            const v = req.headers.get(n);
            if (v !== null) headers[n] = v;
          }
          if (ip) headers["x-forwarded-for"] = ip;
          const up = proxy.upstreamOf(route);
          if (up.host) headers.host = up.host;
          const ok = server.upgrade(req, { data: relayData(`${up.scheme === "https" ? "wss" : "ws"}://${target}${route.pathAndQuery}`, headers, { sandboxId: route.sandboxId }) });
          return ok ? undefined : badGateway(route.sandboxId, "WebSocket upgrade failed");
        }
        return proxy.forward(req, route, ip);
      }
      const direct = await o.direct?.(req, url);
      if (direct) return direct;
      const page = await site?.fetch(req, url);
      if (page) return page;
      const terminal = terminals.upgrade(req, url, server);
      if (terminal === "upgraded") return undefined;
      if (terminal) return terminal;
      const selfAuth = SELF_AUTH_PATHS.some((p) => p.test(url.pathname));
      if (!selfAuth && !PUBLIC_PATHS.some((p) => p.test(url.pathname)) && !keyMatches(req.headers.get("x-api-key"), o.apiKey)) {
        // no server path or setting name here: whoever reads this has not shown a key (the node's
        // start banner and its "node listening" log line say where the key is)
        return errorResponse("api.unauthorized", UNAUTHORIZED_MESSAGE);
      }
      const len = Number(req.headers.get("content-length") ?? 0);
      if (!selfAuth && len > o.maxBodyBytes) return errorResponse("api.body_too_large", `request body of ${len} bytes exceeds the limit of ${o.maxBodyBytes}`);
      try {
        const ticket = terminals.handleTicket(req, url);
        if (ticket) return ticket;
      } catch (e) {
        return toErrorResponse(e);
      }
      return app.handle(req);
    },
    websocket: withTerminals(
      wsRelay<WsData>({
        onOpen: (ws) => o.proxy!.track(ws.data.sandboxId, () => ws.close(1001, "sandbox went away")),
        unreachable: "sandbox port unreachable",
      }),
      terminals,
    ),
  });
}

/** Where the terminal bridge reaches sandbox `id`'s envd: its proxy route, when running. */
function envdOf(proxy: SandboxProxy | null, id: string): ReturnType<EnvdLookup> {
  const r = proxy?.routes.get(id);
  if (!r) return { missing: "not_found" };
  if (r.state !== "running" || !r.host) return { missing: "not_running", state: r.state };
  return { base: `http://${r.host.includes(":") ? `[${r.host}]` : r.host}:${ENVD_PORT}`, token: r.envdAccessToken };
}
