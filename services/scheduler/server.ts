/**
 * Composition of a running scheduler: store (SQLite or Redis), discovery (static or
 * Kubernetes), core (its report expiry started), and the nice-grpc server on `[scheduler] addr`.
 */
import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import { createServer } from "nice-grpc";
import { logger } from "../../src/observability/log.ts";
import type { SchedulerConfig } from "./config.ts";
import { SchedulerCore } from "./core.ts";
import { KubernetesDiscovery } from "./discovery/kubernetes.ts";
import { StaticDiscovery } from "./discovery/static.ts";
import type { Discovery } from "./discovery/types.ts";
import { SchedulerError } from "./errors.ts";
import { schedulerService, servedDefinition } from "./grpc.ts";
import { RedisStore } from "./store/redis.ts";
import { SqliteStore } from "./store/sqlite.ts";
import type { SchedulerStore } from "./store/types.ts";
import { errorMessage } from "../../src/util/error.ts";

/** A started scheduler. */
export interface RunningScheduler {
  /** host:port actually bound. */
  addr: string;
  port: number;
  core: SchedulerCore;
  /** Stop serving (in-flight RPCs finish), stop report expiry and discovery, close the store. */
  close(): Promise<void>;
}

function parseListen(addr: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(addr);
  if (!m || Number(m[3]) > 65535) throw new SchedulerError("scheduler.bad_config", `invalid [scheduler] addr ${JSON.stringify(addr)}: expected host:port`, { addr });
  return { host: m[1] ?? (m[2] || "0.0.0.0"), port: Number(m[3]) };
}

/** Open the configured store. @throws SchedulerError store_failed (Redis unreachable) / DbError. */
export async function openStore(c: SchedulerConfig): Promise<SchedulerStore> {
  if (c.store === "redis") {
    const s = new RedisStore(c.redisUrl, c.redisPrefix, c.redisConnectTimeoutMs);
    try {
      await s.ping();
    } catch (e) {
      await s.close();
      throw e;
    }
    return s;
  }
  if (c.dbPath !== ":memory:") mkdirSync(dirname(c.dbPath), { recursive: true });
  return new SqliteStore(c.dbPath);
}

/**
 * Start a scheduler.
 * @throws SchedulerError bad_config, store_failed, discovery_failed; Error when the address
 *   cannot be bound. Nothing stays open when it throws.
 */
export async function startScheduler(c: SchedulerConfig): Promise<RunningScheduler> {
  const log = logger("scheduler");
  const { host, port } = parseListen(c.addr);
  const discovery: Discovery = c.discovery === "kubernetes" ? new KubernetesDiscovery(c.kubernetes) : new StaticDiscovery(c.nodes);
  const store = await openStore(c);
  try {
    await discovery.start();
  } catch (e) {
    await store.close();
    throw e;
  }
  const core = new SchedulerCore(store, discovery, { strategy: c.strategy, bindingTtlMs: c.bindingTtlMs, reportTtlMs: c.reportTtlMs, goneNodeTtlMs: c.goneNodeTtlMs, rebindAfterMs: c.rebindAfterMs, maxP2pArtifacts: c.maxP2pArtifacts });
  const server = createServer();
  server.add(servedDefinition(), schedulerService(core));
  let bound: number;
  try {
    bound = await server.listen(`${host.includes(":") ? `[${host}]` : host}:${port}`);
  } catch (e) {
    await discovery.close();
    await store.close();
    throw new SchedulerError("scheduler.bad_config", `cannot listen on ${c.addr}: ${errorMessage(e)}`, { addr: c.addr }, { cause: e });
  }
  core.startExpiry();
  log.info({ addr: `${host}:${bound}`, store: store.kind, discovery: discovery.mode, strategy: c.strategy, nodes: core.listNodes().map((n) => n.nodeId) }, "scheduler listening");
  let closing: Promise<void> | undefined;
  return {
    addr: `${host}:${bound}`,
    port: bound,
    core,
    close: () =>
      (closing ??= (async () => {
        await server.shutdown();
        await core.stopExpiry();
        await discovery.close();
        await store.close();
      })()),
  };
}
