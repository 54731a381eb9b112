/**
 * Lifecycle event and webhook routes, as E2B serves them (../shared/docs/e2b-lifecycle-events.md
 * §4–5; docs/events.md):
 * - `GET /events/sandboxes/{id}`, `GET /events/sandboxes`: query `offset` (default 0), `limit`
 *   (1..100, default 10), `orderAsc` (default false: newest first), `types` (repeated or
 *   comma-separated). The node-wide listing also takes `cursor` (this node's extension, the feed
 *   `agentenv events --follow` reads): events after it, oldest first; every node-wide answer
 *   carries `x-next-cursor`, the cursor to go on from (without `cursor`: the newest event's).
 * - `/events/webhooks` CRUD: POST 201, GET, GET/PATCH one 200, DELETE 200 without a body (E2B's
 *   server: "the service this replaces answers 200", not the 204 of its other deletes);
 *   `PUT /events/webhooks/{id}` creates (201) or replaces (200) a webhook under a given UUID (the
 *   gateway registers one webhook on every node with it); `GET .../{id}/deliveries` the delivery
 *   log grouped by event. The signing secret is never served.
 */
import { Elysia, t } from "elysia";
import { EVENT_TYPES, isEventType, TEAM_ID, type EventQuery, type EventsService, type EventType, type WebhookRecord } from "../../events/index.ts";
import { ApiError } from "../errors.ts";
import { strictBody, type BodyPolicy } from "../strict.ts";

/** Header of the node-wide listing: the cursor to follow the feed from. */
export const NEXT_CURSOR_HEADER = "x-next-cursor";

const open = { additionalProperties: true };
const WebhookFields = {
  name: t.String({ description: "shown in lists" }),
  url: t.String({ description: "absolute http(s) URL the events are POSTed to" }),
  events: t.Array(t.String(), { description: `event types: ${EVENT_TYPES.join(", ")}` }),
  enabled: t.Optional(t.Boolean({ description: "default true" })),
  signatureSecret: t.String({ description: "signs each delivery (header e2b-signature); never returned" }),
};
export const NewWebhookBody = t.Object(WebhookFields, open);
export const WebhookUpdateBody = t.Object(
  {
    name: t.Optional(WebhookFields.name),
    url: t.Optional(WebhookFields.url),
    events: t.Optional(WebhookFields.events),
    enabled: t.Optional(t.Boolean()),
    signatureSecret: t.Optional(WebhookFields.signatureSecret),
  },
  open,
);

/** E2B `WebhookDetail` (no secret). */
export function webhookDetail(w: WebhookRecord) {
  return { id: w.id, teamId: TEAM_ID, name: w.name, createdAt: new Date(w.createdAt).toISOString(), url: w.url, enabled: w.enabled, events: w.events };
}

function int(q: URLSearchParams, name: string, def: number, min: number, max: number): number {
  const raw = q.get(name);
  if (raw === null || raw === "") return def;
  const v = Number(raw);
  if (!/^\d+$/.test(raw) || v < min || v > max) throw new ApiError("api.bad_limit", `${name} must be an integer between ${min} and ${max}, got ${raw}`, { [name]: raw });
  return v;
}

function bool(q: URLSearchParams, name: string, def: boolean): boolean {
  const raw = q.get(name);
  if (raw === null || raw === "") return def;
  if (raw !== "true" && raw !== "false") throw new ApiError("api.validation", `${name} must be true or false, got ${raw}`, { [name]: raw });
  return raw === "true";
}

/** `types=a&types=b` or `types=a,b`. @throws ApiError api.validation naming an unknown type */
function typesOf(q: URLSearchParams, name = "types"): EventType[] {
  const out = q.getAll(name).flatMap((v) => v.split(",")).filter(Boolean);
  for (const x of out) if (!isEventType(x)) throw new ApiError("api.validation", `unknown event type ${JSON.stringify(x)} in ${name}: expected one of ${EVENT_TYPES.join(", ")}`, { [name]: x });
  return out as EventType[];
}

/** The E2B listing query of `url`. */
export function eventQuery(url: URL): EventQuery {
  const q = url.searchParams;
  return { offset: int(q, "offset", 0, 0, 1_000_000_000), limit: int(q, "limit", 10, 1, 100), orderAsc: bool(q, "orderAsc", false), types: typesOf(q) };
}

const time = (q: URLSearchParams, name: string) => {
  const raw = q.get(name);
  if (raw === null || raw === "") return undefined;
  const v = /^\d+$/.test(raw) ? Number(raw) : Date.parse(raw);
  if (Number.isNaN(v)) throw new ApiError("api.bad_time", `${name} must be RFC 3339 or unix ms, got ${raw}`, { [name]: raw });
  return v;
};

/** Routes of the events family, to `.use()` in the app; bodies checked by `bodies`. */
export function eventRoutes(events: EventsService, bodies: BodyPolicy) {
  const json = (body: unknown, status: number) => Response.json(body, { status });
  return new Elysia({ name: "events", normalize: false })
    .get("/events/sandboxes/:sandboxID", ({ params, request }) => events.sandboxEvents(params.sandboxID, eventQuery(new URL(request.url))), {
      detail: { summary: "Lifecycle events of a sandbox (kept [events] retention_hours)", tags: ["events"] },
    })
    .get(
      "/events/sandboxes",
      ({ request, set }) => {
        const url = new URL(request.url);
        const raw = url.searchParams.get("cursor");
        if (raw === null) {
          set.headers[NEXT_CURSOR_HEADER] = String(events.head());
          return events.list(eventQuery(url));
        }
        if (!/^\d{0,16}$/.test(raw)) throw new ApiError("api.validation", `cursor must be one this node handed out (${NEXT_CURSOR_HEADER}), got ${JSON.stringify(raw)}`, { cursor: raw });
        const page = events.feed(Number(raw || 0), int(url.searchParams, "limit", 10, 1, 100), typesOf(url.searchParams));
        set.headers[NEXT_CURSOR_HEADER] = String(page.cursor);
        return page.events;
      },
      { detail: { summary: "Lifecycle events of every sandbox; with cursor: the feed after it, oldest first", tags: ["events"] } },
    )
    .get("/events/webhooks", () => events.listWebhooks().map(webhookDetail), { detail: { summary: "List webhooks", tags: ["events"] } })
    .post("/events/webhooks", async ({ body }) => json(webhookDetail((await events.putWebhook(body)).record), 201), {
      ...strictBody(bodies, NewWebhookBody),
      detail: { summary: "Register a webhook (name, url, events, enabled, signatureSecret)", tags: ["events"] },
    })
    .put(
      "/events/webhooks/:webhookID",
      async ({ params, body }) => {
        const r = await events.putWebhook(body, params.webhookID);
        return json(webhookDetail(r.record), r.created ? 201 : 200);
      },
      { ...strictBody(bodies, NewWebhookBody), detail: { summary: "Create or replace a webhook under a given UUID (how the gateway registers one on every node)", tags: ["events"] } },
    )
    .get("/events/webhooks/:webhookID", ({ params }) => webhookDetail(events.getWebhook(params.webhookID)), { detail: { summary: "Get a webhook", tags: ["events"] } })
    .patch("/events/webhooks/:webhookID", async ({ params, body }) => webhookDetail(await events.updateWebhook(params.webhookID, body)), {
      ...strictBody(bodies, WebhookUpdateBody),
      detail: { summary: "Change a webhook (any of name, url, events, enabled, signatureSecret)", tags: ["events"] },
    })
    .delete(
      "/events/webhooks/:webhookID",
      async ({ params }) => {
        await events.deleteWebhook(params.webhookID);
        return new Response(null, { status: 200 });
      },
      { detail: { summary: "Delete a webhook, its queue and its delivery log", tags: ["events"] } },
    )
    .get(
      "/events/webhooks/:webhookID/deliveries",
      ({ params, request }) => {
        const q = new URL(request.url).searchParams;
        const status = q.getAll("deliveryStatus").flatMap((v) => v.split(",")).filter(Boolean);
        for (const s of status) if (s !== "success" && s !== "failed") throw new ApiError("api.validation", `deliveryStatus must be success or failed, got ${s}`, { deliveryStatus: s });
        const page = events.deliveries(params.webhookID, {
          limit: int(q, "limit", 25, 1, 100),
          orderAsc: bool(q, "orderAsc", false),
          cursor: q.get("cursor") || undefined,
          start: time(q, "start"),
          end: time(q, "end"),
          status: status.length === 1 ? (status[0] as "success" | "failed") : undefined,
          eventTypes: typesOf(q, "eventType"),
        });
        return {
          data: page.data.map((d) => {
            const requestBody = events.events.bodyOf(d.eventId) ?? "";
            return {
              eventId: d.eventId,
              eventType: d.eventType,
              sandboxId: d.sandboxId,
              attempts: d.attempts.map((a) => ({
                id: a.id,
                teamId: TEAM_ID,
                webhookId: a.webhookId,
                eventId: a.eventId,
                sandboxId: a.sandboxId,
                eventType: a.eventType,
                status: a.status,
                durationMs: a.durationMs,
                requestBody,
                requestHeaders: JSON.stringify({ "content-type": "application/json", "e2b-webhook-id": a.webhookId, "e2b-delivery-id": a.id, "e2b-signature-version": "v1", "e2b-signature": "[redacted]" }),
                requestUrl: a.requestUrl,
                ...(a.responseBody !== null ? { responseBody: a.responseBody } : {}),
                ...(a.responseStatus !== null ? { responseHttpStatusCode: a.responseStatus } : {}),
                errorClass: a.errorClass,
                ...(a.errorMessage !== null ? { errorMessage: a.errorMessage } : {}),
                timestamp: new Date(a.at).toISOString(),
              })),
            };
          }),
          nextCursor: page.nextCursor,
        };
      },
      { detail: { summary: "Delivery log of a webhook, grouped by event (cursor, limit, orderAsc, start, end, deliveryStatus, eventType)", tags: ["events"] } },
    );
}
