/**
 * Typed view of `[scheduler]` and `[scheduler.kubernetes]` (documented in config/default.toml).
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { Config } from "../../src/config/index.ts";
import { SchedulerError } from "./errors.ts";
import type { StrategyName } from "./strategy.ts";
import type { KubernetesOptions } from "./discovery/kubernetes.ts";

/** The scheduler's settings, from `[scheduler]` (keys documented in src/config/schema.ts). */
export interface SchedulerConfig {
  /** gRPC listen address, host:port. */
  addr: string;
  strategy: StrategyName;
  store: "sqlite" | "redis";
  /** SQLite file. */
  dbPath: string;
  /** redis://[user:password@]host:port[/db] */
  redisUrl: string;
  /** Prefix of every Redis key. */
  redisPrefix: string;
  /** Bound on connecting to Redis, ms. */
  redisConnectTimeoutMs: number;
  /** Freshness of a binding, ms. */
  bindingTtlMs: number;
  /** Report age after which a node is UNHEALTHY, ms. */
  reportTtlMs: number;
  /** Report age after which a node's bindings are dropped, ms. */
  goneNodeTtlMs: number;
  /** Report age after which a node's sandboxes may be moved (RebindSandbox), ms. */
  rebindAfterMs: number;
  discovery: "static" | "kubernetes";
  /** Static entries "id=url". */
  nodes: string[];
  /** Bound on P2P artifact records. */
  maxP2pArtifacts: number;
  kubernetes: KubernetesOptions;
}

const SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/**
 * Read the scheduler's config (types and ranges were checked when it was loaded).
 * @throws SchedulerError scheduler.bad_config for Kubernetes discovery without a namespace or API server.
 */
export function schedulerConfig(cfg: Config, env: Record<string, string | undefined> = process.env): SchedulerConfig {
  const sc = cfg.scheduler;
  const kc = sc.kubernetes;
  let namespace = kc.namespace;
  let apiUrl = kc.api_url;
  if (sc.discovery === "kubernetes") {
    if (!namespace && existsSync(SA_NAMESPACE)) namespace = readFileSync(SA_NAMESPACE, "utf8").trim();
    if (!namespace) throw new SchedulerError("scheduler.bad_config", `[scheduler.kubernetes] namespace is empty and ${SA_NAMESPACE} does not exist (not in a Pod)`, {});
    if (!apiUrl && env.KUBERNETES_SERVICE_HOST) {
      const host = env.KUBERNETES_SERVICE_HOST.includes(":") ? `[${env.KUBERNETES_SERVICE_HOST}]` : env.KUBERNETES_SERVICE_HOST;
      apiUrl = `https://${host}:${env.KUBERNETES_SERVICE_PORT ?? "443"}`;
    }
    if (!apiUrl) throw new SchedulerError("scheduler.bad_config", "[scheduler.kubernetes] api_url is empty and KUBERNETES_SERVICE_HOST is not set (not in a Pod)", {});
  }
  return {
    addr: sc.addr,
    strategy: sc.strategy,
    store: sc.store,
    dbPath: sc.db_path || join(cfg.home_path, "scheduler.db"),
    redisUrl: sc.redis_url,
    redisPrefix: sc.redis_prefix,
    redisConnectTimeoutMs: sc.redis_connect_timeout_ms,
    bindingTtlMs: sc.binding_ttl_secs * 1000,
    reportTtlMs: sc.report_ttl_secs * 1000,
    goneNodeTtlMs: sc.gone_node_ttl_secs * 1000,
    rebindAfterMs: sc.rebind_after_secs * 1000,
    discovery: sc.discovery,
    nodes: sc.nodes,
    maxP2pArtifacts: sc.max_p2p_artifacts,
    kubernetes: {
      apiUrl,
      namespace,
      serviceName: kc.service_name,
      port: kc.port,
      scheme: kc.scheme,
      // outside a Pod (tests, a kubectl proxy) the files do not exist: no token, system roots
      tokenPath: kc.token_path && existsSync(kc.token_path) ? kc.token_path : null,
      caPath: kc.ca_path && existsSync(kc.ca_path) ? kc.ca_path : null,
      watchTimeoutSecs: kc.watch_timeout_secs,
      retryBackoffMs: kc.retry_backoff_ms,
      requestTimeoutMs: kc.request_timeout_ms,
      maxListBytes: kc.max_list_bytes,
      maxEventBytes: kc.max_event_bytes,
    },
  };
}
