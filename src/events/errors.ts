/** Errors of the events subsystem (lifecycle events and webhooks). Adding a code: see src/errors.ts. */
import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Every events failure, with its meaning; statuses in src/api/status.ts. */
export const EVENTS_ERRORS = {
  "events.not_found": "no event of this sandbox is kept (details.sandboxId)",
  "events.bad_request": "a malformed query or webhook field (details.field)",
  "events.webhook_not_found": "no webhook with this id (details.webhookId)",
  "events.webhook_limit": "the node holds [events] max_webhooks webhooks already (details.limit)",
} as const satisfies ErrorTable;
/** An EventsError code. */
export type EventsErrorCode = keyof typeof EVENTS_ERRORS;

/** A typed events failure; `details` names the field, sandbox or webhook. */
export class EventsError extends AgentEnvError<EventsErrorCode> {}
