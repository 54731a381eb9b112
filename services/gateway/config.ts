/**
 * Typed view of the gateway's config: `[gateway]`, `[cluster] scheduler_endpoint`, and the
 * client key (`[api] key` / AENV_API_KEY, else generated in $home_path/api-key).
 */
import type { Config } from "../../src/config/index.ts";
import { ConfigError } from "../../src/config/index.ts";
import { secretsKeyPath } from "../../src/secrets/index.ts";

/** The gateway's settings (keys documented in src/config/schema.ts, `[gateway]`). */
export interface GatewayConfig {
  /** Listen address, host:port. */
  addr: string;
  /** Scheduler gRPC target. */
  schedulerEndpoint: string;
  /** Key clients must send ("" = resolve from the data dir). */
  apiKey: string;
  /** Key sent to nodes ("" = the client key). */
  nodeApiKey: string;
  /** Data dir (the generated api-key file, the webhook registry gateway-webhooks.json). */
  homePath: string;
  /** Sandbox host suffixes; the first is returned to SDKs as `domain`. */
  domains: string[];
  /**
   * Bound on connecting to a node, and on its response headers once the request is sent (lists:
   * the whole answer; WebSockets: the upstream open), ms.
   */
  requestTimeoutMs: number;
  /** A streamed request body's longest pause between chunks, ms. */
  idleTimeoutMs: number;
  /** Sandbox traffic: longest wait for the answer's headers from the request body's end, or for a request without one from its start, ms. */
  responseTimeoutMs: number;
  /** Bound on creates, pauses, resumes, connects and uploads forwarded to a node, ms. */
  createTimeoutMs: number;
  /** Bound on one scheduler RPC, ms. */
  schedulerTimeoutMs: number;
  /** Pause between tries of a scheduler RPC while its channel is down, ms. */
  schedulerRetryMs: number;
  /** Schedule calls one create may make. */
  createAttempts: number;
  /** Sandbox routes (and upload holders) remembered, LRU. */
  routeCacheSize: number;
  /** Reuse of the scheduler's node list, ms. */
  nodeListTtlMs: number;
  /** Largest control-plane body read, bytes. */
  maxBodyBytes: number;
  /** The console at /console/ (`[console]`); absent or disabled: not served. */
  console?: { enabled: boolean; refreshMs: number };
  /** Largest node answer read whole (merged lists, rewritten create and fork answers), bytes. */
  maxAnswerBytes: number;
  /** The cluster's secrets (`[secrets]` of the gateway's config): key file and limit. */
  secretsKeyPath: string;
  maxSecrets: number;
  /**
   * `[secrets] store = "redis"`: the Redis every gateway replica keeps the secrets in (url: `[secrets]
   * redis_url`, else `[scheduler] redis_url`). Absent: the file store in homePath.
   */
  secretsRedis?: { url: string; prefix: string; connectTimeoutMs: number };
  /** Rounds that bring every node up to the webhooks registered here (webhook-sync.ts), ms. */
  webhookSync: { intervalMs: number; fullCheckMs: number };
}

/** @throws ConfigError config.bad_value when no scheduler endpoint is configured. */
export function gatewayConfig(cfg: Config): GatewayConfig {
  const g = cfg.gateway;
  if (!cfg.cluster.scheduler_endpoint) throw new ConfigError("config.bad_value", "the gateway needs [cluster] scheduler_endpoint (AENV__cluster__scheduler_endpoint)", { key: "cluster.scheduler_endpoint" });
  return {
    addr: g.addr,
    schedulerEndpoint: cfg.cluster.scheduler_endpoint,
    apiKey: cfg.api.key,
    nodeApiKey: g.node_api_key,
    homePath: cfg.home_path,
    domains: g.sandbox_proxy_domains,
    requestTimeoutMs: g.request_timeout_ms,
    idleTimeoutMs: g.idle_timeout_ms,
    responseTimeoutMs: g.response_timeout_ms,
    createTimeoutMs: g.create_timeout_ms,
    schedulerTimeoutMs: g.scheduler_timeout_ms,
    schedulerRetryMs: g.scheduler_retry_ms,
    createAttempts: g.create_attempts,
    routeCacheSize: g.route_cache_size,
    nodeListTtlMs: g.node_list_ttl_ms,
    maxBodyBytes: g.max_body_bytes,
    console: { enabled: cfg.console.enabled, refreshMs: cfg.console.refresh_ms },
    maxAnswerBytes: g.max_answer_bytes,
    secretsKeyPath: secretsKeyPath(cfg),
    maxSecrets: cfg.secrets.max_secrets,
    ...(cfg.secrets.store === "redis" ? { secretsRedis: { url: cfg.secrets.redis_url || cfg.scheduler.redis_url, prefix: cfg.secrets.redis_prefix, connectTimeoutMs: cfg.secrets.redis_connect_timeout_ms } } : {}),
    webhookSync: { intervalMs: g.webhook_sync_interval_ms, fullCheckMs: g.webhook_full_check_ms },
  };
}
