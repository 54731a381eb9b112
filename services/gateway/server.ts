/**
 * The gateway's listener: one Bun.serve that sends sandbox traffic (HTTP and WebSocket) to the
 * sandbox's node, template file uploads (authorised by their URL token) to the node that handed
 * out the URL, checks X-API-Key on everything else (but /health and /metrics), and hands it to
 * Gateway. idleTimeout 0: envd streams may be silent for long. maxRequestBodySize is unbounded
 * because sandbox traffic streams; control-plane bodies are counted as they are read
 * (`[gateway] max_body_bytes`).
 */
import type { Server } from "bun";
import { keyMatches, loadOrCreateApiKey } from "../../src/api/auth.ts";
import { parseAddr } from "../../src/api/server.ts";
import { relayData, wsRelay, type RelayData } from "../../src/api/ws-relay.ts";
import { logger } from "../../src/observability/log.ts";
import { UPLOAD_PATH_RE } from "../../src/template/index.ts";
import { ConsoleSite, TERMINAL_PATH_RE } from "../../src/console/index.ts";
import { RESOLVE_PATH } from "../../src/secrets/index.ts";
import type { GatewayConfig } from "./config.ts";
import { dataRoute } from "./dataplane.ts";
import { gatewayError, GatewayError } from "./errors.ts";
import { dataError, Gateway, routeHeaders } from "./gateway.ts";
import { errorMessage } from "../../src/util/error.ts";

/** A started gateway. */
export interface RunningGateway {
  url: string;
  port: number;
  apiKey: string;
  gateway: Gateway;
  close(): Promise<void>;
}

/** Client headers a WebSocket upgrade carries on to the node. */
const WS_PASS = ["x-access-token", "authorization", "cookie", "origin", "user-agent", "e2b-sandbox-id", "e2b-sandbox-port", "x-agentenv-sandbox-id", "x-agentenv-sandbox-port", "x-agentenv-target-port", "e2b-traffic-access-token", "sec-websocket-protocol"];
const log = logger("gateway");

/**
 * Start the gateway.
 * @throws GatewayError / ApiError when the key file or the webhook registry cannot be read
 *   (bad_state); GatewayError internal when the address is taken.
 */
export function startGateway(c: GatewayConfig): RunningGateway {
  const { key } = loadOrCreateApiKey(c.apiKey, c.homePath);
  const gw = new Gateway(c, key);
  const { hostname, port } = parseAddr(c.addr);
  const site = c.console?.enabled ? new ConsoleSite({ role: "gateway", refreshMs: c.console.refreshMs }) : null;
  site?.preload();
  let server: Server<RelayData>;
  try {
    server = Bun.serve<RelayData>({
      hostname,
      port,
      idleTimeout: 0,
      maxRequestBodySize: Number.MAX_SAFE_INTEGER,
      error(err) {
        log.error({ err }, "gateway request handler failed");
        return gatewayError("gateway.internal", `the gateway failed handling the request: ${err?.message ?? String(err)}`);
      },
      async fetch(req, srv) {
        const url = new URL(req.url);
        const ip = srv.requestIP(req)?.address ?? null;
        const route = dataRoute(req, url, c.domains);
        if (typeof route === "string") return gatewayError("gateway.bad_request", route);
        if (route) {
          if (req.headers.get("upgrade")?.toLowerCase() !== "websocket") return gw.data(req, url, route, ip);
          let node;
          try {
            node = await gw.resolve(route.sandboxId);
          } catch (e) {
            return dataError(route.sandboxId, e);
          }
          if (!node) return dataError(route.sandboxId, null);
          const headers: Record<string, string> = { ...routeHeaders(route) };
          for (const n of WS_PASS) {
            const v = req.headers.get(n);
            if (v !== null) headers[n] = v;
          }
          if (ip) headers["x-forwarded-for"] = ip;
          const upstreamUrl = node.endpoint.replace(/^http/, "ws") + url.pathname + url.search;
          const data = relayData(upstreamUrl, headers, { connectTimeoutMs: c.requestTimeoutMs, unreachable: `node ${node.nodeId} (${node.endpoint}) is unreachable` });
          return srv.upgrade(req, { data }) ? undefined : gatewayError("gateway.bad_request", "WebSocket upgrade failed");
        }
        if (UPLOAD_PATH_RE.test(url.pathname)) return gw.upload(req, url, ip);
        const page = await site?.fetch(req, url);
        if (page) return page;
        // a terminal's WebSocket goes to the sandbox's node, which checks the ticket in its first frame
        const terminal = TERMINAL_PATH_RE.exec(url.pathname);
        if (terminal && req.headers.get("upgrade")?.toLowerCase() === "websocket") {
          let id: string;
          try {
            id = decodeURIComponent(terminal[1]!);
          } catch {
            return gatewayError("gateway.bad_request", "malformed sandbox id in the path");
          }
          const node = await gw.resolve(id).catch(() => null);
          if (!node) return gatewayError("gateway.sandbox_not_found", `sandbox "${id}" doesn't exist or you don't have access to it`);
          const data = relayData(node.endpoint.replace(/^http/, "ws") + url.pathname, {}, { connectTimeoutMs: c.requestTimeoutMs, unreachable: `node ${node.nodeId} (${node.endpoint}) is unreachable` });
          return srv.upgrade(req, { data }) ? undefined : gatewayError("gateway.bad_request", "WebSocket upgrade failed");
        }
        // nodes asking for a secret's value authenticate with the node key, not the client key
        if (url.pathname === RESOLVE_PATH) return gw.secrets.resolve(req);
        if (url.pathname !== "/health" && url.pathname !== "/metrics" && !keyMatches(req.headers.get("x-api-key"), key)) {
          return gatewayError("gateway.unauthorized", "Invalid API key: use the gateway's key ([api] key / AENV_API_KEY, or the api-key file in its data directory)");
        }
        const len = Number(req.headers.get("content-length") ?? 0);
        if (len > c.maxBodyBytes) return gatewayError("gateway.body_too_large", `request body of ${len} bytes exceeds the limit of ${c.maxBodyBytes}`);
        return gw.control(req, url, ip);
      },
      websocket: wsRelay<RelayData>({ unreachable: "the sandbox's node is unreachable" }),
    });
  } catch (e) {
    void gw.close();
    throw new GatewayError("gateway.internal", `cannot listen on ${c.addr}: ${errorMessage(e)}`, { addr: c.addr });
  }
  const shown = hostname === "0.0.0.0" || hostname === "::" ? "127.0.0.1" : hostname;
  const url = `http://${shown.includes(":") ? `[${shown}]` : shown}:${server.port}`;
  log.info({ url, scheduler: c.schedulerEndpoint, secretsStore: gw.secrets.kind }, "gateway listening");
  gw.webhookSync.start();
  return {
    url,
    port: server.port!,
    apiKey: key,
    gateway: gw,
    close: async () => {
      await server.stop(true);
      await gw.close();
    },
  };
}
