/** Typed view of the `[events]` config section (documented in config/default.toml). */
import type { Config } from "../config/index.ts";

export interface EventsConfig {
  /** How long events and delivery attempts are kept, ms. */
  retentionMs: number;
  /** Period of the retention scan, ms. */
  pruneIntervalMs: number;
  /** Most webhooks the node holds. */
  maxWebhooks: number;
  /** Events waiting per webhook before its oldest waiting one is dropped. */
  queueMax: number;
  /** Bound on one delivery, ms. */
  timeoutMs: number;
  /** First retry wait, ms (doubling per failure up to `retryMaxMs`). */
  retryInitialMs: number;
  retryMaxMs: number;
  /** Response body bytes kept per attempt. */
  responseBodyBytes: number;
  /** Attempts kept per webhook. */
  maxAttemptsLogged: number;
}

/** The `[events]` section of `cfg`. */
export function eventsConfig(cfg: Config): EventsConfig {
  const e = cfg.events;
  return {
    retentionMs: e.retention_hours * 3_600_000,
    pruneIntervalMs: e.prune_interval_ms,
    maxWebhooks: e.max_webhooks,
    queueMax: e.webhook_queue_max,
    timeoutMs: e.webhook_timeout_ms,
    retryInitialMs: e.webhook_retry_initial_ms,
    retryMaxMs: Math.max(e.webhook_retry_max_ms, e.webhook_retry_initial_ms),
    responseBodyBytes: e.webhook_response_body_bytes,
    maxAttemptsLogged: e.max_attempts_logged,
  };
}
