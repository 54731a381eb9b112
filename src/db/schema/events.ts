/**
 * Lifecycle events and webhooks, owned by src/events: the events the node recorded (kept for
 * `[events] retention_hours`), the webhooks registered on it, each webhook's queue of events to
 * deliver (the on-disk delivery queue, bounded per webhook) and its log of delivery attempts.
 * Times are unix milliseconds.
 */
import { index, integer, primaryKey, sqliteTable, text } from "drizzle-orm/sqlite-core";

/**
 * One lifecycle event. `seq` is the node-wide order (the feed's cursor follows it); `body` the
 * event as the API serves it (E2B `SandboxEvent`, JSON).
 */
export const sandboxEvents = sqliteTable(
  "sandbox_events",
  {
    seq: integer("seq").primaryKey({ autoIncrement: true }),
    id: text("id").notNull().unique(),
    sandboxId: text("sandbox_id").notNull(),
    type: text("type").notNull(),
    at: integer("at").notNull(),
    body: text("body").notNull(),
  },
  (t) => [index("sandbox_events_sandbox_idx").on(t.sandboxId, t.seq), index("sandbox_events_at_idx").on(t.at)],
);

/** A webhook (E2B `/events/webhooks`): `events` a JSON array of event types; `secret` never served. */
export const eventWebhooks = sqliteTable("event_webhooks", {
  id: text("id").primaryKey(),
  name: text("name").notNull(),
  url: text("url").notNull(),
  events: text("events", { mode: "json" }).$type<string[]>().notNull(),
  enabled: integer("enabled", { mode: "boolean" }).notNull(),
  secret: text("secret").notNull(),
  createdAt: integer("created_at").notNull(),
  updatedAt: integer("updated_at").notNull(),
});

/**
 * Events waiting for delivery to a webhook, delivered in `event_seq` order. A row goes when the
 * receiver took the event (2xx), when the webhook goes, or when its event ages out.
 */
export const webhookQueue = sqliteTable(
  "webhook_queue",
  {
    webhookId: text("webhook_id")
      .notNull()
      .references(() => eventWebhooks.id, { onDelete: "cascade" }),
    eventSeq: integer("event_seq")
      .notNull()
      .references(() => sandboxEvents.seq, { onDelete: "cascade" }),
    attempts: integer("attempts").notNull().default(0),
    /** Not before this time (backoff after a failed attempt). */
    nextAt: integer("next_at").notNull(),
  },
  (t) => [primaryKey({ columns: [t.webhookId, t.eventSeq] })],
);

/** One delivery attempt (E2B `WebhookDelivery`); `id` is the attempt's e2b-delivery-id. */
export const webhookAttempts = sqliteTable(
  "webhook_attempts",
  {
    id: text("id").primaryKey(),
    webhookId: text("webhook_id")
      .notNull()
      .references(() => eventWebhooks.id, { onDelete: "cascade" }),
    eventId: text("event_id").notNull(),
    eventType: text("event_type").notNull(),
    sandboxId: text("sandbox_id").notNull(),
    /** "success" | "failed". */
    status: text("status").notNull(),
    at: integer("at").notNull(),
    durationMs: integer("duration_ms").notNull(),
    requestUrl: text("request_url").notNull(),
    responseStatus: integer("response_status"),
    responseBody: text("response_body"),
    /** E2B errorClass: http_error | dns_error | timeout | transport_error | request_error; null on success. */
    errorClass: text("error_class"),
    errorMessage: text("error_message"),
  },
  (t) => [index("webhook_attempts_webhook_idx").on(t.webhookId, t.at), index("webhook_attempts_event_idx").on(t.webhookId, t.eventId)],
);
