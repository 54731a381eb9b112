/**
 * Webhooks in the node database: the registrations (`event_webhooks`), each one's queue of events
 * to deliver (`webhook_queue`: the delivery queue on disk, so a restart loses nothing) and its log
 * of delivery attempts (`webhook_attempts`). Validation of what a client sends is here too
 * (E2B / upstream AgentENV rules: a name, an absolute http(s) URL, known event types, a secret).
 */
import type { Db } from "../../db/index.ts";
import { EventsError } from "../errors.ts";
import { isEventType, type DeliveryAttempt, type EventType, type NewWebhook, type SandboxLifecycleEvent, type WebhookRecord, type WebhookUpdate } from "../types.ts";

interface WebhookRow {
  id: string;
  name: string;
  url: string;
  events: string;
  enabled: number;
  secret: string;
  created_at: number;
  updated_at: number;
}

/** The event at the head of a webhook's queue, with its attempt count and due time. */
export interface QueuedEvent {
  seq: number;
  attempts: number;
  nextAt: number;
  event: SandboxLifecycleEvent;
  /** The JSON sent (the stored body, byte for byte: what the signature covers). */
  body: string;
}

/** Longest webhook name and URL accepted, characters. */
const MAX_NAME = 256;
const MAX_URL = 2048;

function toRecord(r: WebhookRow): WebhookRecord {
  return { id: r.id, name: r.name, url: r.url, events: JSON.parse(r.events) as EventType[], enabled: r.enabled === 1, secret: r.secret, createdAt: r.created_at, updatedAt: r.updated_at };
}

const bad = (field: string, message: string) => new EventsError("events.bad_request", message, { field });

/** Check a webhook name. @throws EventsError bad_request */
function checkName(v: unknown): string {
  if (typeof v !== "string" || v.trim() === "" || v.length > MAX_NAME) throw bad("name", `name must be a non-empty string of at most ${MAX_NAME} characters`);
  return v;
}

/** Check a receiver URL: absolute http or https. @throws EventsError bad_request */
function checkUrl(v: unknown): string {
  let u: URL;
  try {
    if (typeof v !== "string" || v.length > MAX_URL) throw new Error("not a string");
    u = new URL(v);
  } catch {
    throw bad("url", `url must be an absolute http(s) URL of at most ${MAX_URL} characters, got ${JSON.stringify(v)}`);
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") throw bad("url", `url must use http or https, got ${u.protocol}`);
  return v as string;
}

/** Check an events filter: a non-empty array of known types, without repeats. @throws EventsError bad_request */
function checkEvents(v: unknown): EventType[] {
  if (!Array.isArray(v) || v.length === 0) throw bad("events", "events must be a non-empty array of event types, e.g. [\"sandbox.lifecycle.created\"]");
  for (const t of v) if (typeof t !== "string" || !isEventType(t)) throw bad("events", `unknown event type ${JSON.stringify(t)}`);
  return [...new Set(v as EventType[])];
}

/** Check a signing secret. @throws EventsError bad_request */
function checkSecret(v: unknown): string {
  if (typeof v !== "string" || v === "" || v.length > 1024) throw bad("signatureSecret", "signatureSecret must be a non-empty string of at most 1024 characters");
  return v;
}

export class WebhookStore {
  constructor(private readonly db: Db) {}

  /** Every webhook, oldest first. */
  list(): WebhookRecord[] {
    return this.db.sqlite.query<WebhookRow, []>("SELECT * FROM event_webhooks ORDER BY created_at, id").all().map(toRecord);
  }

  /** The webhook `id`. @throws EventsError webhook_not_found */
  get(id: string): WebhookRecord {
    const r = this.db.sqlite.query<WebhookRow, [string]>("SELECT * FROM event_webhooks WHERE id = ?").get(id);
    if (!r) throw new EventsError("events.webhook_not_found", `Webhook not found: ${id}`, { webhookId: id });
    return toRecord(r);
  }

  /** How many webhooks there are. */
  count(): number {
    return this.db.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM event_webhooks").get()!.n;
  }

  /**
   * Create webhook `id` from `w`, or replace it (same id: a registration repeated through the
   * gateway); a replaced webhook keeps its creation time and queue.
   * @throws EventsError bad_request naming the field
   */
  put(id: string, w: NewWebhook, now: number): { record: WebhookRecord; created: boolean } {
    const name = checkName(w.name);
    const url = checkUrl(w.url);
    const events = checkEvents(w.events);
    const secret = checkSecret(w.signatureSecret);
    const enabled = w.enabled ?? true;
    if (typeof enabled !== "boolean") throw bad("enabled", "enabled must be a boolean");
    const existed = this.db.sqlite.query("SELECT 1 FROM event_webhooks WHERE id = ?").get(id) !== null;
    this.db.sqlite
      .query(
        `INSERT INTO event_webhooks (id, name, url, events, enabled, secret, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)
         ON CONFLICT(id) DO UPDATE SET name = ?2, url = ?3, events = ?4, enabled = ?5, secret = ?6, updated_at = ?7`,
      )
      .run(id, name, url, JSON.stringify(events), enabled ? 1 : 0, secret, now);
    return { record: this.get(id), created: !existed };
  }

  /**
   * Change fields of webhook `id`.
   * @throws EventsError webhook_not_found, bad_request naming the field
   */
  update(id: string, u: WebhookUpdate, now: number): WebhookRecord {
    const cur = this.get(id);
    const next: NewWebhook = {
      name: u.name === undefined ? cur.name : checkName(u.name),
      url: u.url === undefined ? cur.url : checkUrl(u.url),
      events: u.events === undefined ? cur.events : checkEvents(u.events),
      enabled: u.enabled === undefined ? cur.enabled : u.enabled,
      signatureSecret: u.signatureSecret === undefined ? cur.secret : checkSecret(u.signatureSecret),
    };
    return this.put(id, next, now).record;
  }

  /** Delete webhook `id` with its queue and delivery log. @throws EventsError webhook_not_found */
  delete(id: string): void {
    if (this.db.sqlite.query("DELETE FROM event_webhooks WHERE id = ?").run(id).changes === 0) {
      throw new EventsError("events.webhook_not_found", `Webhook not found: ${id}`, { webhookId: id });
    }
  }

  /** Drop every event waiting for webhook `id` (it was disabled). */
  clearQueue(id: string): void {
    this.db.sqlite.query("DELETE FROM webhook_queue WHERE webhook_id = ?").run(id);
  }

  /** Events waiting for webhook `id`. */
  queueDepth(id: string): number {
    return this.db.sqlite.query<{ n: number }, [string]>("SELECT count(*) AS n FROM webhook_queue WHERE webhook_id = ?").get(id)!.n;
  }

  /** Drop the `n` oldest events waiting for webhook `id`. @returns how many went */
  dropOldest(id: string, n: number): number {
    return this.db.sqlite.query("DELETE FROM webhook_queue WHERE webhook_id = ?1 AND event_seq IN (SELECT event_seq FROM webhook_queue WHERE webhook_id = ?1 ORDER BY event_seq LIMIT ?2)").run(id, n).changes;
  }

  /** The oldest event waiting for webhook `id`, if any. */
  head(id: string): QueuedEvent | undefined {
    const r = this.db.sqlite
      .query<{ seq: number; attempts: number; next_at: number; body: string }, [string]>(
        "SELECT q.event_seq AS seq, q.attempts, q.next_at, e.body FROM webhook_queue q JOIN sandbox_events e ON e.seq = q.event_seq WHERE q.webhook_id = ? ORDER BY q.event_seq LIMIT 1",
      )
      .get(id);
    return r ? { seq: r.seq, attempts: r.attempts, nextAt: r.next_at, event: JSON.parse(r.body) as SandboxLifecycleEvent, body: r.body } : undefined;
  }

  /** The receiver took event `seq`: it leaves the queue. @returns false when it was gone already (dropped, aged out) */
  delivered(id: string, seq: number): boolean {
    return this.db.sqlite.query("DELETE FROM webhook_queue WHERE webhook_id = ? AND event_seq = ?").run(id, seq).changes > 0;
  }

  /** A delivery of `seq` failed: count it and try again not before `nextAt` (unix ms). */
  retryLater(id: string, seq: number, attempts: number, nextAt: number): void {
    this.db.sqlite.query("UPDATE webhook_queue SET attempts = ?, next_at = ? WHERE webhook_id = ? AND event_seq = ?").run(attempts, nextAt, id, seq);
  }

  /** Log one delivery attempt. */
  logAttempt(a: DeliveryAttempt): void {
    this.db.sqlite
      .query(
        "INSERT INTO webhook_attempts (id, webhook_id, event_id, event_type, sandbox_id, status, at, duration_ms, request_url, response_status, response_body, error_class, error_message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
      )
      .run(a.id, a.webhookId, a.eventId, a.eventType, a.sandboxId, a.status, a.at, a.durationMs, a.requestUrl, a.responseStatus, a.responseBody, a.errorClass, a.errorMessage);
  }

  /**
   * One page of webhook `id`'s delivery log, grouped by event: events in the order of their first
   * attempt (newest first unless `orderAsc`), after `cursor` (the position of the previous page's
   * last event: its first attempt's rowid, which grows with every attempt logged).
   */
  deliveries(
    id: string,
    q: { limit: number; orderAsc: boolean; cursor?: number; start?: number; end?: number; status?: "success" | "failed"; eventTypes: string[] },
  ): { data: { eventId: string; eventType: string; sandboxId: string; attempts: DeliveryAttempt[] }[]; next: number | null } {
    const conds = ["webhook_id = ?"];
    const args: (string | number)[] = [id];
    if (q.start !== undefined) (conds.push("at >= ?"), args.push(q.start));
    if (q.end !== undefined) (conds.push("at < ?"), args.push(q.end));
    if (q.status) (conds.push("status = ?"), args.push(q.status));
    if (q.eventTypes.length) (conds.push(`event_type IN (${q.eventTypes.map(() => "?").join(", ")})`), args.push(...q.eventTypes));
    const dir = q.orderAsc ? "ASC" : "DESC";
    const having = q.cursor !== undefined ? `HAVING first ${q.orderAsc ? ">" : "<"} ?` : "";
    const events = this.db.sqlite
      .query<{ event_id: string; first: number }, (string | number)[]>(
        `SELECT event_id, min(rowid) AS first FROM webhook_attempts WHERE ${conds.join(" AND ")} GROUP BY event_id ${having} ORDER BY first ${dir} LIMIT ?`,
      )
      .all(...args, ...(q.cursor !== undefined ? [q.cursor] : []), q.limit + 1);
    const page = events.slice(0, q.limit);
    const data = page.map((e) => {
      const attempts = this.db.sqlite
        .query<Record<string, unknown>, [string, string]>("SELECT * FROM webhook_attempts WHERE webhook_id = ? AND event_id = ? ORDER BY rowid")
        .all(id, e.event_id)
        .map(attemptOf);
      return { eventId: e.event_id, eventType: attempts[0]?.eventType ?? "", sandboxId: attempts[0]?.sandboxId ?? "", attempts };
    });
    const last = page[page.length - 1];
    return { data, next: events.length > q.limit && last ? last.first : null };
  }

  /** Delete attempts older than `before` (unix ms), and beyond the newest `keep` per webhook. @returns how many */
  pruneAttempts(before: number, keep: number): number {
    let n = this.db.sqlite.query("DELETE FROM webhook_attempts WHERE at < ?").run(before).changes;
    for (const { id } of this.db.sqlite.query<{ id: string }, []>("SELECT id FROM event_webhooks").all()) {
      n += this.db.sqlite
        .query("DELETE FROM webhook_attempts WHERE webhook_id = ?1 AND rowid IN (SELECT rowid FROM webhook_attempts WHERE webhook_id = ?1 ORDER BY rowid DESC LIMIT -1 OFFSET ?2)")
        .run(id, keep).changes;
    }
    return n;
  }
}

function attemptOf(r: Record<string, unknown>): DeliveryAttempt {
  return {
    id: r.id as string,
    webhookId: r.webhook_id as string,
    eventId: r.event_id as string,
    eventType: r.event_type as string,
    sandboxId: r.sandbox_id as string,
    status: r.status as "success" | "failed",
    at: r.at as number,
    durationMs: r.duration_ms as number,
    requestUrl: r.request_url as string,
    responseStatus: (r.response_status as number | null) ?? null,
    responseBody: (r.response_body as string | null) ?? null,
    errorClass: (r.error_class as string | null) ?? null,
    errorMessage: (r.error_message as string | null) ?? null,
  };
}
