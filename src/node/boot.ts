/**
 * Assemble and start a node: node locks (runtime path + network prefix) and the listen address
 * first, then database in the data dir, orchestrator over the given runtime (start-up reaping and
 * reconciliation included), API key; the listener answers 503 until everything is ready.
 */
import { createPrivateKey, X509Certificate } from "node:crypto";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { type Config, ConfigError } from "../config/index.ts";
import { openDb, type Db } from "../db/index.ts";
import { logger } from "../observability/log.ts";
import { Orchestrator, orchestratorConfig, type OrchestratorConfig, type SandboxRuntime } from "../orchestrator/index.ts";
import { createVmRuntime } from "../sandbox/index.ts";
import { buildApp } from "../api/app.ts";
import { apiKeyPath, loadOrCreateApiKey } from "../api/auth.ts";
import { NodeError } from "./errors.ts";
import { acquireNodeLocks } from "./lock.ts";
import { reporterOptions, startReporting } from "./reporting.ts";
import { randomHex } from "../orchestrator/index.ts";
import { buildCommit, nodeId } from "../api/node.ts";
import { SandboxProxy } from "../api/proxy.ts";
import { parseAddr, serve, type ServeOptions } from "../api/server.ts";
import { handleUpload } from "../api/routes/templates.ts";
import { createTemplateService, nodeRegistries, sandboxLayers } from "./templates.ts";
import { setUpOutboundProxy } from "./outbound.ts";
import { redactUrl } from "../util/proxy.ts";
import type { TemplateService } from "../template/index.ts";
import { EventsService, eventsConfig } from "../events/index.ts";
import { openSecrets, type NodeSecrets } from "../secrets/index.ts";
import { errorMessage } from "../util/error.ts";

/** A started node. `close()` stops listening, then the orchestrator (shutdown_action), then the DB. */
export interface RunningNode {
  url: string;
  apiKey: string;
  apiKeySource: "config" | "file" | "generated";
  orch: Orchestrator;
  /** Lifecycle events and webhooks of this node. */
  events: EventsService;
  db: Db;
  port: number;
  /** Port of the HTTPS listener ([sandbox_proxy] tls_cert_path + tls_key_path), null without one. */
  httpsPort: number | null;
  close(): Promise<void>;
}

/** Makes the runtime once the database is open (default: the VM runtime). */
export type RuntimeFactory = (cfg: Config, db: Db, oc: OrchestratorConfig) => Promise<SandboxRuntime>;

/**
 * The HTTPS listener's certificate and key ([sandbox_proxy] tls_cert_path, tls_key_path), or null
 * when both are empty.
 * @throws ConfigError `config.bad_value` when only one is set, a file is not a PEM certificate or
 *   private key, or the key is not the certificate's; `config.unreadable` when a file cannot be read.
 */
function proxyTls(cfg: Config): { cert: string; key: string } | null {
  const { tls_cert_path: certPath, tls_key_path: keyPath } = cfg.sandbox_proxy;
  if (!certPath && !keyPath) return null;
  if (!certPath || !keyPath) {
    const missing = certPath ? "sandbox_proxy.tls_key_path" : "sandbox_proxy.tls_cert_path";
    throw new ConfigError("config.bad_value", `config: ${missing} is empty: HTTPS needs both tls_cert_path and tls_key_path`, { key: missing, value: "", expected: "a PEM file path" });
  }
  const read = (key: string, path: string) => {
    try {
      return readFileSync(path, "utf8");
    } catch (e) {
      throw new ConfigError("config.unreadable", `config: sandbox_proxy.${key} ${path}: ${errorMessage(e)}`, { path, key: `sandbox_proxy.${key}` });
    }
  };
  const cert = read("tls_cert_path", certPath);
  const key = read("tls_key_path", keyPath);
  const bad = (name: string, path: string, expected: string, e?: unknown) =>
    new ConfigError("config.bad_value", `config: sandbox_proxy.${name} ${path}: expected ${expected}${e ? ` (${errorMessage(e)})` : ""}`, { key: `sandbox_proxy.${name}`, value: path, expected });
  let x509: X509Certificate;
  try {
    x509 = new X509Certificate(cert);
  } catch (e) {
    throw bad("tls_cert_path", certPath, "a PEM certificate", e);
  }
  let pk: ReturnType<typeof createPrivateKey>;
  try {
    pk = createPrivateKey(key);
  } catch (e) {
    throw bad("tls_key_path", keyPath, "a PEM private key", e);
  }
  if (!x509.checkPrivateKey(pk)) throw bad("tls_key_path", keyPath, `the private key of the certificate in ${certPath}`);
  return { cert, key };
}

/**
 * Start a node from `cfg`.
 * @throws ConfigError for `[image]` settings that cannot be used (before anything is touched);
 *   NodeError `node.already_running` when another live node holds this runtime path or network
 *   prefix (nothing is reaped then), `node.listen_failed` when the address is taken;
 *   ConfigError / OrchestratorError / DbError / VmmError / NetError for bad config, unusable
 *   data dir, host networking or failed reconciliation.
 */
export async function bootNode(cfg: Config, makeRuntime: RuntimeFactory = createVmRuntime): Promise<RunningNode> {
  const log = logger("node");
  const home = cfg.home_path;
  // Before anything reaps (VMM leftovers, disk exports, <name_prefix>* namespaces): make sure no
  // other node owns this runtime path or network prefix, and that our listen address is free.
  const { hostname, port } = parseAddr(cfg.api.addr);
  const reporting = reporterOptions(cfg);
  // before anything reaches out (the S3 store, registries): one proxy decision for every client
  // ([image] checked here too: a bad setting stops start-up before anything is reaped)
  const outbound = setUpOutboundProxy(cfg);
  if (outbound.httpsProxy || outbound.httpProxy) log.info({ https: redactUrl(outbound.httpsProxy), http: redactUrl(outbound.httpProxy), noProxy: outbound.noProxy }, "outbound requests go through a proxy");
  const registries = nodeRegistries(cfg, outbound);
  const locks = acquireNodeLocks(cfg.runtime_path, cfg.network.name_prefix);
  const serveOpts: ServeOptions = { hostname, port, apiKey: "", app: null, proxy: null, maxBodyBytes: cfg.api.max_body_bytes, console: cfg.console };
  let server: ReturnType<typeof serve>;
  let tlsServer: ReturnType<typeof serve> | null = null;
  try {
    server = serve(serveOpts);
  } catch (e) {
    locks.release();
    throw new NodeError("node.listen_failed", `cannot listen on ${cfg.api.addr}: ${errorMessage(e)}`, { addr: cfg.api.addr });
  }
  try {
    const tls = proxyTls(cfg);
    if (tls) {
      const addr = parseAddr(cfg.sandbox_proxy.https_addr);
      try {
        tlsServer = serve(serveOpts, { ...addr, tls });
      } catch (e) {
        throw new NodeError("node.listen_failed", `cannot listen for HTTPS on ${cfg.sandbox_proxy.https_addr}: ${errorMessage(e)}`, { addr: cfg.sandbox_proxy.https_addr });
      }
    }
  } catch (e) {
    await server.stop(true);
    locks.release();
    throw e;
  }
  const undo = async (db?: Db) => {
    await tlsServer?.stop(true);
    await server.stop(true);
    db?.close();
    locks.release();
  };
  let db: Db;
  try {
    mkdirSync(home, { recursive: true });
    db = openDb(join(home, "agentenv.db"));
  } catch (e) {
    await undo();
    throw e;
  }
  let secrets: NodeSecrets;
  try {
    // first: the key file is made (or refused) before anything else uses it
    secrets = openSecrets(cfg, db);
  } catch (e) {
    await undo(db);
    throw e;
  }
  const oc = orchestratorConfig(cfg);
  let runtime: SandboxRuntime;
  try {
    runtime = await makeRuntime(cfg, db, oc);
  } catch (e) {
    await undo(db);
    throw e;
  }
  const orch = new Orchestrator(db, runtime, oc);
  // recording before the orchestrator starts: sandboxes a restart finds orphaned are events too
  const events = new EventsService(db, eventsConfig(cfg), orch);
  let key: string, source: RunningNode["apiKeySource"];
  let templates: TemplateService;
  try {
    await orch.start();
    events.start();
    ({ key, source } = loadOrCreateApiKey(cfg.api.key, home));
    templates = createTemplateService(cfg, runtime, () => sandboxLayers(orch), registries);
  } catch (e) {
    await orch.close().catch(() => {});
    await events.close().catch(() => {});
    await undo(db);
    throw e;
  }
  const domains = cfg.sandbox_proxy.domains;
  const proxy = new SandboxProxy(orch, {
    domains,
    connectTimeoutMs: cfg.sandbox_proxy.connect_timeout_ms,
    idleTimeoutMs: cfg.sandbox_proxy.idle_timeout_ms,
    responseTimeoutMs: cfg.sandbox_proxy.response_timeout_ms,
    settleTimeoutMs: cfg.sandbox_proxy.settle_timeout_ms,
    blockEnvdInternal: cfg.sandbox_proxy.block_envd_internal,
  });
  const id = nodeId(cfg.node.id);
  const commit = buildCommit();
  const identity = { id, clusterId: cfg.node.cluster_id, homePath: home, startedAt: Date.now(), serviceInstanceId: cfg.node.service_instance_id || `${id}-${randomHex(4)}`, commit };
  const app = buildApp({
    orch,
    domain: domains[0] ?? null,
    docs: cfg.api.docs,
    templates,
    node: identity,
    strictBodies: cfg.api.strict_bodies,
    events,
    secrets: secrets.store ? { store: secrets.store } : { remoteUrl: secrets.remoteUrl },
  });
  serveOpts.apiKey = key;
  serveOpts.proxy = proxy;
  serveOpts.direct = (req, url) => handleUpload(req, url, templates);
  serveOpts.app = app;
  const shownHost = hostname === "0.0.0.0" || hostname === "::" ? "127.0.0.1" : hostname;
  const url = `http://${shownHost.includes(":") ? `[${shownHost}]` : shownHost}:${server.port}`;
  const httpsPort = tlsServer?.port ?? null;
  const stopReporting = reporting ? startReporting(reporting, { nodeId: id, clusterId: identity.clusterId, serviceInstanceId: identity.serviceInstanceId, homePath: home, commit }, orch) : null;
  log.info({ url, runtime: runtime.name, apiKeySource: source, ...(source === "config" ? {} : { apiKeyFile: apiKeyPath(home) }), scheduler: reporting?.endpoint ?? null }, "node listening");
  let closing: Promise<void> | undefined;
  return {
    url,
    apiKey: key,
    apiKeySource: source,
    orch,
    events,
    db,
    port: server.port!,
    httpsPort,
    close: () =>
      (closing ??= (async () => {
        // leave the scheduler first: no new sandboxes are placed here while this node stops
        await stopReporting?.();
        await tlsServer?.stop(true);
        await server.stop(true);
        proxy.close();
        try {
          await templates.close();
          await orch.close();
          await events.close();
          db.close();
        } finally {
          locks.release();
        }
      })()),
  };
}
