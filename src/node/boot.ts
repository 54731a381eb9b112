/**
 * Assemble and start a node: node locks (runtime path + network prefix) and the listen address
 * first, then database in the data dir, orchestrator over the given runtime (start-up reaping and
 * reconciliation included), API key; the listener answers 503 until everything is ready.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { type Config } from "../config/index.ts";
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
import { createTemplateService } from "./templates.ts";
import type { TemplateService } from "../template/index.ts";

/** A started node. `close()` stops listening, then the orchestrator (shutdown_action), then the DB. */
export interface RunningNode {
  url: string;
  apiKey: string;
  apiKeySource: "config" | "file" | "generated";
  orch: Orchestrator;
  db: Db;
  port: number;
  close(): Promise<void>;
}

/** Makes the runtime once the database is open (default: the VM runtime). */
export type RuntimeFactory = (cfg: Config, db: Db, oc: OrchestratorConfig) => Promise<SandboxRuntime>;

/**
 * Start a node from `cfg`.
 * @throws NodeError `node.already_running` when another live node holds this runtime path or network
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
  const locks = acquireNodeLocks(cfg.runtime_path, cfg.network.name_prefix);
  const serveOpts: ServeOptions = { hostname, port, apiKey: "", apiKeyHint: null, app: null, proxy: null, maxBodyBytes: cfg.api.max_body_bytes };
  let server: ReturnType<typeof serve>;
  try {
    server = serve(serveOpts);
  } catch (e) {
    locks.release();
    throw new NodeError("node.listen_failed", `cannot listen on ${cfg.api.addr}: ${(e as Error).message}`, { addr: cfg.api.addr });
  }
  const undo = async (db?: Db) => {
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
  const oc = orchestratorConfig(cfg);
  let runtime: SandboxRuntime;
  try {
    runtime = await makeRuntime(cfg, db, oc);
  } catch (e) {
    await undo(db);
    throw e;
  }
  const orch = new Orchestrator(db, runtime, oc);
  let key: string, source: RunningNode["apiKeySource"];
  let templates: TemplateService;
  try {
    await orch.start();
    ({ key, source } = loadOrCreateApiKey(cfg.api.key, home));
    templates = createTemplateService(cfg, runtime);
  } catch (e) {
    await orch.close().catch(() => {});
    await undo(db);
    throw e;
  }
  const domains = cfg.sandbox_proxy.domains;
  const proxy = new SandboxProxy(orch, {
    domains,
    connectTimeoutMs: cfg.sandbox_proxy.connect_timeout_ms,
    idleTimeoutMs: cfg.sandbox_proxy.idle_timeout_ms,
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
  });
  serveOpts.apiKey = key;
  serveOpts.apiKeyHint = source === "config" ? "config [api] key / AENV_API_KEY" : `file ${apiKeyPath(home)}`;
  serveOpts.proxy = proxy;
  serveOpts.direct = (req, url) => handleUpload(req, url, templates);
  serveOpts.app = app;
  const shownHost = hostname === "0.0.0.0" || hostname === "::" ? "127.0.0.1" : hostname;
  const url = `http://${shownHost.includes(":") ? `[${shownHost}]` : shownHost}:${server.port}`;
  const stopReporting = reporting ? startReporting(reporting, { nodeId: id, clusterId: identity.clusterId, serviceInstanceId: identity.serviceInstanceId, homePath: home, commit }, orch) : null;
  log.info({ url, runtime: runtime.name, apiKeySource: source, scheduler: reporting?.endpoint ?? null }, "node listening");
  let closing: Promise<void> | undefined;
  return {
    url,
    apiKey: key,
    apiKeySource: source,
    orch,
    db,
    port: server.port!,
    close: () =>
      (closing ??= (async () => {
        // leave the scheduler first: no new sandboxes are placed here while this node stops
        await stopReporting?.();
        await server.stop(true);
        proxy.close();
        try {
          await templates.close();
          await orch.close();
          db.close();
        } finally {
          locks.release();
        }
      })()),
  };
}
