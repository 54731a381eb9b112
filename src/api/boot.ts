/**
 * Assemble and start a node: database in the data dir, API key, orchestrator over the given
 * runtime (start-up reconciliation included), the API + proxy listener.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { get, type ConfigTable } from "../config/index.ts";
import { openDb, type Db } from "../db/index.ts";
import { logger } from "../observability/log.ts";
import { Orchestrator, orchestratorConfig, type OrchestratorConfig, type SandboxRuntime } from "../orchestrator/index.ts";
import { createVmRuntime } from "../orchestrator/vm-runtime-factory.ts";
import { buildApp } from "./app.ts";
import { loadOrCreateApiKey } from "./auth.ts";
import { nodeId } from "./node.ts";
import { SandboxProxy } from "./proxy.ts";
import { parseAddr, serve } from "./server.ts";

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
export type RuntimeFactory = (cfg: ConfigTable, db: Db, oc: OrchestratorConfig) => Promise<SandboxRuntime>;

/**
 * Start a node from `cfg`.
 * @throws ConfigError / OrchestratorError / DbError / VmmError / NetError for bad config, unusable
 *   data dir, host networking or failed reconciliation.
 */
export async function bootNode(cfg: ConfigTable, makeRuntime: RuntimeFactory = createVmRuntime): Promise<RunningNode> {
  const log = logger("node");
  const home = get<string>(cfg, "home_path");
  mkdirSync(home, { recursive: true });
  const db = openDb(join(home, "agentenv.db"));
  const oc = orchestratorConfig(cfg);
  let runtime: SandboxRuntime;
  try {
    runtime = await makeRuntime(cfg, db, oc);
  } catch (e) {
    db.close();
    throw e;
  }
  const orch = new Orchestrator(db, runtime, oc);
  try {
    await orch.start();
  } catch (e) {
    await runtime.close().catch(() => {});
    db.close();
    throw e;
  }
  const { key, source } = loadOrCreateApiKey(get<string>(cfg, "api.key"), home);
  const domains = get<string[]>(cfg, "sandbox_proxy.domains");
  const proxy = new SandboxProxy(orch, {
    domains,
    connectTimeoutMs: get<number>(cfg, "sandbox_proxy.connect_timeout_ms"),
    blockEnvdInternal: get<boolean>(cfg, "sandbox_proxy.block_envd_internal"),
  });
  const app = buildApp({
    orch,
    domain: domains[0] ?? null,
    docs: get<boolean>(cfg, "api.docs"),
    node: { id: nodeId(get<string>(cfg, "node.id")), clusterId: get<string>(cfg, "node.cluster_id"), homePath: home, startedAt: Date.now() },
  });
  const { hostname, port } = parseAddr(get<string>(cfg, "api.addr"));
  let server: ReturnType<typeof serve>;
  try {
    server = serve({ hostname, port, apiKey: key, app, proxy, maxBodyBytes: get<number>(cfg, "api.max_body_bytes") });
  } catch (e) {
    await orch.close();
    db.close();
    throw e;
  }
  const shownHost = hostname === "0.0.0.0" || hostname === "::" ? "127.0.0.1" : hostname;
  const url = `http://${shownHost.includes(":") ? `[${shownHost}]` : shownHost}:${server.port}`;
  log.info({ url, runtime: runtime.name, apiKeySource: source }, "node listening");
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
        await server.stop(true);
        proxy.close();
        await orch.close();
        db.close();
      })()),
  };
}
