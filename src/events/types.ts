/**
 * Sandbox lifecycle events as E2B serves them (../shared/docs/e2b-lifecycle-events.md §2–3): the
 * REST `SandboxEvent` shape (camelCase envelope, snake_case keys inside `eventData`), the event
 * types, and the webhook records of `/events/webhooks`. Webhook bodies are the same JSON as the
 * API serves (E2B's docs: "matches the event format from the API").
 */

/**
 * Event types: E2B's six (infra `ValidSandboxEventTypes`) and two of this node's own, `forked`
 * (once per fork child, `event_data.source_sandbox_id`, as upstream AgentENV sends it) and
 * `failed` (a sandbox that broke: its VM died, a create or pause failed; `event_data.error`).
 */
export const EVENT_TYPES = [
  "sandbox.lifecycle.created",
  "sandbox.lifecycle.resumed",
  "sandbox.lifecycle.paused",
  "sandbox.lifecycle.killed",
  "sandbox.lifecycle.updated",
  "sandbox.lifecycle.checkpointed",
  "sandbox.lifecycle.forked",
  "sandbox.lifecycle.failed",
] as const;

/** One event type. */
export type EventType = (typeof EVENT_TYPES)[number];

/** E2B's legacy `eventLabel` of each type. */
export const EVENT_LABELS: Readonly<Record<EventType, string>> = {
  "sandbox.lifecycle.created": "create",
  "sandbox.lifecycle.resumed": "resume",
  "sandbox.lifecycle.paused": "pause",
  "sandbox.lifecycle.killed": "kill",
  "sandbox.lifecycle.updated": "update",
  "sandbox.lifecycle.checkpointed": "checkpoint",
  "sandbox.lifecycle.forked": "fork",
  "sandbox.lifecycle.failed": "fail",
};

/** Whether `s` names an event type. */
export function isEventType(s: string): s is EventType {
  return (EVENT_TYPES as readonly string[]).includes(s);
}

/** The team every event belongs to: a node serves one team (E2B's nil UUID, as upstream AgentENV). */
export const TEAM_ID = "00000000-0000-0000-0000-000000000000";

/** `eventData.execution` (E2B): the run that just ended (paused, killed, failed). */
export interface ExecutionData {
  /** RFC 3339 UTC. */
  started_at: string;
  vcpu_count: number;
  memory_mb: number;
  /** Milliseconds the run lasted. */
  execution_time: number;
}

/** A lifecycle event (E2B REST `SandboxEvent`). */
export interface SandboxLifecycleEvent {
  /** UUID; the same in every delivery of the event (receivers deduplicate by it). */
  id: string;
  version: "v2";
  type: EventType;
  eventCategory: "lifecycle";
  eventLabel: string;
  /** snake_case keys: sandbox_metadata, execution, kill_reason, set_timeout, network_egress, ... */
  eventData: Record<string, unknown> | null;
  /** RFC 3339 UTC with milliseconds. */
  timestamp: string;
  sandboxId: string;
  /** UUID of the run (create or resume to pause, kill or failure) the event belongs to. */
  sandboxExecutionId: string;
  sandboxTemplateId: string;
  sandboxBuildId: string;
  sandboxTeamId: string;
}

/** A webhook as stored (the secret included). */
export interface WebhookRecord {
  /** UUID. */
  id: string;
  name: string;
  /** Absolute http(s) URL the events are POSTed to. */
  url: string;
  /** Event types delivered. */
  events: EventType[];
  enabled: boolean;
  /** Signing secret (never served back). */
  secret: string;
  /** Unix ms. */
  createdAt: number;
  updatedAt: number;
}

/** What `POST /events/webhooks` (and the gateway's `PUT`) carries. */
export interface NewWebhook {
  name: string;
  url: string;
  events: string[];
  enabled?: boolean;
  signatureSecret: string;
}

/** What `PATCH /events/webhooks/{id}` may change. */
export type WebhookUpdate = Partial<NewWebhook>;

/** Filter and page of an event listing (E2B: offset, limit, orderAsc, types). */
export interface EventQuery {
  offset: number;
  /** 1..100. */
  limit: number;
  orderAsc: boolean;
  /** Only these types; empty: all. */
  types: EventType[];
}

/** One delivery attempt (E2B `WebhookDelivery`). */
export interface DeliveryAttempt {
  /** The attempt's `e2b-delivery-id`. */
  id: string;
  webhookId: string;
  eventId: string;
  eventType: string;
  sandboxId: string;
  status: "success" | "failed";
  /** Unix ms the attempt started. */
  at: number;
  durationMs: number;
  requestUrl: string;
  responseStatus: number | null;
  /** Cut to `[events] webhook_response_body_bytes`. */
  responseBody: string | null;
  /** http_error | dns_error | timeout | transport_error | request_error; null on success. */
  errorClass: string | null;
  errorMessage: string | null;
}
