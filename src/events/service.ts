/**
 * The node's lifecycle events and webhooks, assembled: the recorder observing the orchestrator,
 * the event and webhook stores, the delivery lanes, and the retention scan. What the API's
 * `/events/...` routes call; the composition root (src/node) makes one per node and closes it
 * after the orchestrator (whose shutdown kills are events too).
 */
import { randomUUID } from "node:crypto";
import type { Db } from "../db/index.ts";
import { logger } from "../observability/log.ts";
import type { OrchestratorObserver } from "../orchestrator/index.ts";
import type { EventsConfig } from "./config.ts";
import { EventsError } from "./errors.ts";
import { EventRecorder } from "./recorder.ts";
import { EventStore, type FeedPage } from "./store.ts";
import type { DeliveryAttempt, EventQuery, EventType, NewWebhook, SandboxLifecycleEvent, WebhookRecord, WebhookUpdate } from "./types.ts";
import { WebhookDispatcher } from "./webhooks/dispatcher.ts";
import { WebhookStore } from "./webhooks/store.ts";

/** One event's delivery history (E2B's deliveries `data` entry). */
export interface EventDeliveries {
  eventId: string;
  eventType: string;
  sandboxId: string;
  attempts: DeliveryAttempt[];
}

/** What `deliveries()` takes: E2B's query of `GET /events/webhooks/{id}/deliveries`. */
export interface DeliveryQuery {
  limit: number;
  orderAsc: boolean;
  /** `nextCursor` of a previous page. */
  cursor?: string;
  start?: number;
  end?: number;
  status?: "success" | "failed";
  eventTypes: string[];
}

export class EventsService {
  readonly events: EventStore;
  readonly webhooks: WebhookStore;
  readonly dispatcher: WebhookDispatcher;
  private readonly log = logger("events");
  private readonly unobserve: () => void;
  private timer: ReturnType<typeof setInterval> | undefined;

  /**
   * Record `orch`'s changes from now on and start delivering to the enabled webhooks (events
   * queued before a restart first). Make it before the orchestrator starts: the sandboxes a
   * restart finds orphaned are events too.
   */
  constructor(
    db: Db,
    readonly cfg: EventsConfig,
    orch: { observe(o: OrchestratorObserver): () => void },
    private readonly now: () => number = Date.now,
  ) {
    this.events = new EventStore(db);
    this.webhooks = new WebhookStore(db);
    this.dispatcher = new WebhookDispatcher(this.webhooks, cfg, this.log, now);
    this.dispatcher.start();
    this.unobserve = orch.observe(new EventRecorder(this.events, this.dispatcher, this.log, now));
  }

  /** Start the retention scan (one scan at once). */
  start(): void {
    this.prune();
    this.timer ??= setInterval(() => this.prune(), this.cfg.pruneIntervalMs);
  }

  /** Stop recording, the scan and the deliveries (queues stay on disk). */
  async close(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    this.unobserve();
    await this.dispatcher.close();
  }

  /** Delete events and attempts older than the retention. @returns how many rows went */
  prune(): number {
    try {
      const before = this.now() - this.cfg.retentionMs;
      const events = this.events.prune(before);
      // their queued deliveries went with them
      if (events > 0) this.dispatcher.recount();
      return events + this.webhooks.pruneAttempts(before, this.cfg.maxAttemptsLogged);
    } catch (err) {
      this.log.error({ err }, "pruning old events failed");
      return 0;
    }
  }

  /** Events of sandbox `id`. @throws EventsError not_found when none is kept */
  sandboxEvents(id: string, q: EventQuery): SandboxLifecycleEvent[] {
    return this.events.bySandbox(id, q);
  }

  /** Events of every sandbox. */
  list(q: EventQuery): SandboxLifecycleEvent[] {
    return this.events.list(q);
  }

  /** The node-wide feed after `cursor` (0: from the oldest kept). */
  feed(cursor: number, limit: number, types: readonly EventType[]): FeedPage {
    return this.events.feed(cursor, limit, types);
  }

  /** The cursor of the newest event (a feed from it sees later events only). */
  head(): number {
    return this.events.head();
  }

  listWebhooks(): WebhookRecord[] {
    return this.webhooks.list();
  }

  /** @throws EventsError webhook_not_found */
  getWebhook(id: string): WebhookRecord {
    return this.webhooks.get(id);
  }

  /**
   * Register a webhook; with `id`, create or replace that one (the gateway registers one webhook
   * under the same id on every node).
   * @throws EventsError bad_request naming the field, webhook_limit past `[events] max_webhooks`
   */
  async putWebhook(w: NewWebhook, id?: string): Promise<{ record: WebhookRecord; created: boolean }> {
    const key = id ?? randomUUID();
    if (!UUID_RE.test(key)) throw new EventsError("events.bad_request", `webhook id must be a UUID, got ${JSON.stringify(key)}`, { field: "id" });
    const exists = id !== undefined && this.webhooks.list().some((x) => x.id === id);
    if (!exists && this.webhooks.count() >= this.cfg.maxWebhooks) {
      throw new EventsError("events.webhook_limit", `this node holds ${this.cfg.maxWebhooks} webhooks, its limit ([events] max_webhooks)`, { limit: this.cfg.maxWebhooks });
    }
    const r = this.webhooks.put(key, w, this.now());
    await this.dispatcher.changed(key, r.record);
    return r;
  }

  /** @throws EventsError webhook_not_found, bad_request */
  async updateWebhook(id: string, u: WebhookUpdate): Promise<WebhookRecord> {
    const r = this.webhooks.update(id, u, this.now());
    await this.dispatcher.changed(id, r);
    return r;
  }

  /** @throws EventsError webhook_not_found */
  async deleteWebhook(id: string): Promise<void> {
    this.webhooks.delete(id);
    await this.dispatcher.changed(id, null);
  }

  /**
   * One page of webhook `id`'s delivery log.
   * @throws EventsError webhook_not_found, bad_request (a malformed cursor)
   */
  deliveries(id: string, q: DeliveryQuery): { data: EventDeliveries[]; nextCursor: string | null } {
    this.webhooks.get(id);
    if (q.cursor !== undefined && !/^\d{1,16}$/.test(q.cursor)) throw new EventsError("events.bad_request", `invalid cursor ${JSON.stringify(q.cursor)}`, { field: "cursor" });
    const page = this.webhooks.deliveries(id, { ...q, cursor: q.cursor === undefined ? undefined : Number(q.cursor) });
    return { data: page.data, nextCursor: page.next === null ? null : String(page.next) };
  }
}

/** A UUID (any version), lowercase or uppercase hex. */
export const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
