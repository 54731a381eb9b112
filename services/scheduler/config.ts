/**
 * Typed view of `[scheduler]` and `[scheduler.kubernetes]` (documented in config/default.toml).
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { get, type ConfigTable } from "../../src/config/index.ts";
import { SchedulerError } from "./errors.ts";
import { STRATEGIES, type StrategyName } from "./strategy.ts";
import type { KubernetesOptions } from "./discovery/kubernetes.ts";

export interface SchedulerConfig {
  addr: string;
  strategy: StrategyName;
  store: "sqlite" | "redis";
  /** SQLite file. */
  dbPath: string;
  redisUrl: string;
  redisPrefix: string;
  bindingTtlMs: number;
  reportTtlMs: number;
  sweepIntervalMs: number;
  discovery: "static" | "kubernetes";
  /** Static entries "id=url". */
  nodes: string[];
  maxP2pArtifacts: number;
  kubernetes: KubernetesOptions;
}

const SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

function positive(cfg: ConfigTable, key: string): number {
  const v = get<number>(cfg, key);
  if (!Number.isFinite(v) || v <= 0) throw new SchedulerError("scheduler.bad_config", `${key} must be a positive number, got ${v}`, { key });
  return v;
}

/**
 * Read the scheduler's config.
 * @throws SchedulerError scheduler.bad_config for unknown strategy/store/discovery values,
 *   non-positive durations, or Kubernetes discovery without a namespace or API server.
 */
export function schedulerConfig(cfg: ConfigTable, env: Record<string, string | undefined> = process.env): SchedulerConfig {
  const strategy = get<string>(cfg, "scheduler.strategy");
  if (!STRATEGIES.includes(strategy as StrategyName)) throw new SchedulerError("scheduler.bad_config", `[scheduler] strategy must be one of ${STRATEGIES.join(", ")}, got ${JSON.stringify(strategy)}`, { strategy });
  const store = get<string>(cfg, "scheduler.store");
  if (store !== "sqlite" && store !== "redis") throw new SchedulerError("scheduler.bad_config", `[scheduler] store must be "sqlite" or "redis", got ${JSON.stringify(store)}`, { store });
  const discovery = get<string>(cfg, "scheduler.discovery");
  if (discovery !== "static" && discovery !== "kubernetes") throw new SchedulerError("scheduler.bad_config", `[scheduler] discovery must be "static" or "kubernetes", got ${JSON.stringify(discovery)}`, { discovery });
  const k = (key: string) => `scheduler.kubernetes.${key}`;
  let namespace = get<string>(cfg, k("namespace"));
  let apiUrl = get<string>(cfg, k("api_url"));
  const scheme = get<string>(cfg, k("scheme"));
  if (discovery === "kubernetes") {
    if (!namespace && existsSync(SA_NAMESPACE)) namespace = readFileSync(SA_NAMESPACE, "utf8").trim();
    if (!namespace) throw new SchedulerError("scheduler.bad_config", `[scheduler.kubernetes] namespace is empty and ${SA_NAMESPACE} does not exist (not in a Pod)`, {});
    if (!apiUrl && env.KUBERNETES_SERVICE_HOST) {
      const host = env.KUBERNETES_SERVICE_HOST.includes(":") ? `[${env.KUBERNETES_SERVICE_HOST}]` : env.KUBERNETES_SERVICE_HOST;
      apiUrl = `https://${host}:${env.KUBERNETES_SERVICE_PORT ?? "443"}`;
    }
    if (!apiUrl) throw new SchedulerError("scheduler.bad_config", "[scheduler.kubernetes] api_url is empty and KUBERNETES_SERVICE_HOST is not set (not in a Pod)", {});
    if (scheme !== "http" && scheme !== "https") throw new SchedulerError("scheduler.bad_config", `[scheduler.kubernetes] scheme must be http or https, got ${JSON.stringify(scheme)}`, { scheme });
  }
  const tokenPath = get<string>(cfg, k("token_path"));
  const caPath = get<string>(cfg, k("ca_path"));
  return {
    addr: get<string>(cfg, "scheduler.addr"),
    strategy: strategy as StrategyName,
    store,
    dbPath: get<string>(cfg, "scheduler.db_path") || join(get<string>(cfg, "home_path"), "scheduler.db"),
    redisUrl: get<string>(cfg, "scheduler.redis_url"),
    redisPrefix: get<string>(cfg, "scheduler.redis_prefix"),
    bindingTtlMs: positive(cfg, "scheduler.binding_ttl_secs") * 1000,
    reportTtlMs: positive(cfg, "scheduler.report_ttl_secs") * 1000,
    sweepIntervalMs: positive(cfg, "scheduler.sweep_interval_ms"),
    discovery,
    nodes: get<string[]>(cfg, "scheduler.nodes"),
    maxP2pArtifacts: positive(cfg, "scheduler.max_p2p_artifacts"),
    kubernetes: {
      apiUrl,
      namespace,
      serviceName: get<string>(cfg, k("service_name")),
      port: positive(cfg, k("port")),
      scheme: scheme as "http" | "https",
      // outside a Pod (tests, a kubectl proxy) the files do not exist: no token, system roots
      tokenPath: tokenPath && existsSync(tokenPath) ? tokenPath : null,
      caPath: caPath && existsSync(caPath) ? caPath : null,
      watchTimeoutSecs: positive(cfg, k("watch_timeout_secs")),
      retryBackoffMs: positive(cfg, k("retry_backoff_ms")),
    },
  };
}
