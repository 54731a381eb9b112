/**
 * Sandbox lifecycle events and signed webhooks (E2B's `/events/...`; docs/events.md): recorded
 * per sandbox in the node database from the orchestrator's state changes, served by the API,
 * delivered to webhooks in order, at least once, from a queue on disk.
 */
export { EventsService, UUID_RE, type DeliveryQuery, type EventDeliveries } from "./service.ts";
export { eventsConfig, type EventsConfig } from "./config.ts";
export { EventsError, EVENTS_ERRORS, type EventsErrorCode } from "./errors.ts";
export { EventRecorder, type EventSink } from "./recorder.ts";
export { EventStore, type FeedPage } from "./store.ts";
export { WebhookDispatcher, backoffMs } from "./webhooks/dispatcher.ts";
export { WebhookStore } from "./webhooks/store.ts";
export { webhookSignature, verifyWebhookSignature, SIGNATURE_HEADER, SIGNATURE_VERSION, SIGNATURE_VERSION_HEADER, WEBHOOK_ID_HEADER, DELIVERY_ID_HEADER } from "./webhooks/signature.ts";
export * from "./types.ts";
