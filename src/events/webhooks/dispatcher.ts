/**
 * Webhook delivery: one lane per enabled webhook, each an async loop that POSTs the oldest event
 * waiting in that webhook's queue (on disk, webhook_queue) and takes the next only once the
 * receiver answered 2xx, so every receiver gets its events in order (per sandbox, and node-wide),
 * at least once. A failed delivery is logged and retried after a wait that doubles from
 * `retryInitialMs` up to `retryMaxMs`; the event stays queued meanwhile (across restarts too).
 *
 * Nothing of this runs on the API's path but `queued()`, a counter and, past a webhook's
 * `queueMax`, one DELETE of its oldest waiting events: a dead or slow receiver holds up its own
 * lane only, never the API nor another webhook's lane. A delivery is bounded by `timeoutMs` and
 * keeps at most `responseBodyBytes` of the answer.
 *
 * Request (E2B, ../shared/docs/e2b-lifecycle-events.md §6): `POST <url>`, the event JSON as the
 * API serves it, headers content-type, e2b-webhook-id, e2b-delivery-id (new per attempt),
 * e2b-signature-version v1, e2b-signature. Redirects are not followed (a 3xx is a failure).
 */
import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import { errorMessage } from "../../util/error.ts";
import type { EventsConfig } from "../config.ts";
import type { EventSink } from "../recorder.ts";
import type { DeliveryAttempt, EventType, WebhookRecord } from "../types.ts";
import { DELIVERY_ID_HEADER, SIGNATURE_HEADER, SIGNATURE_VERSION, SIGNATURE_VERSION_HEADER, WEBHOOK_ID_HEADER, webhookSignature } from "./signature.ts";
import type { QueuedEvent, WebhookStore } from "./store.ts";

/** What a lane needs of the dispatcher. */
type Settings = Pick<EventsConfig, "timeoutMs" | "retryInitialMs" | "retryMaxMs" | "responseBodyBytes">;

/** The wait before attempt `attempts + 1` after `attempts` failures, ms. */
export function backoffMs(attempts: number, initialMs: number, maxMs: number): number {
  return Math.min(maxMs, initialMs * 2 ** Math.min(Math.max(attempts - 1, 0), 40));
}

/** E2B's `errorClass` of a failed fetch. */
function errorClassOf(e: unknown): string {
  const err = e as { name?: string; code?: string; message?: string };
  if (err?.name === "TimeoutError") return "timeout";
  const text = `${err?.code ?? ""} ${err?.message ?? ""}`;
  if (/ENOTFOUND|EAI_AGAIN|DNS|getaddrinfo/i.test(text)) return "dns_error";
  if (/ECONNREFUSED|ConnectionRefused|ECONNRESET|ConnectionClosed|socket|EPIPE|EHOSTUNREACH|ENETUNREACH|FailedToOpenSocket/i.test(text)) return "transport_error";
  return "request_error";
}

/** Read at most `max` bytes of `res`'s body as text (the rest is cancelled). */
async function bodyPrefix(res: Response, max: number): Promise<string> {
  if (!res.body) return "";
  const reader = res.body.getReader();
  const parts: Uint8Array[] = [];
  let n = 0;
  try {
    while (n < max) {
      const r = await reader.read();
      if (r.done) break;
      parts.push(r.value);
      n += r.value.length;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
  return new TextDecoder().decode(Buffer.concat(parts).subarray(0, max));
}

/** The delivery loop of one webhook. */
class Lane {
  /** Events waiting (kept in step with the queue table without counting it on every event). */
  depth: number;
  /** Waiting for the queue to get an event (`poke` ends the wait). */
  idle = false;
  readonly done: Promise<void>;
  private wake: (() => void) | null = null;
  private stopped = false;
  private readonly abort = new AbortController();

  constructor(
    public webhook: WebhookRecord,
    private readonly store: WebhookStore,
    private readonly s: Settings,
    private readonly log: Logger,
    private readonly now: () => number,
  ) {
    this.depth = store.queueDepth(webhook.id);
    this.done = this.run();
  }

  /** End a wait (the queue got an event, or the lane stops). */
  poke(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  /** Stop after the delivery in flight (cancelled); the queue stays for the next start. */
  stop(): Promise<void> {
    this.stopped = true;
    this.abort.abort();
    this.poke();
    return this.done;
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = Number.isFinite(ms) ? setTimeout(() => this.poke(), ms) : undefined;
      this.wake = () => {
        clearTimeout(timer);
        this.idle = false;
        resolve();
      };
      if (this.stopped) this.poke();
    });
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      let head: QueuedEvent | undefined;
      try {
        head = this.store.head(this.webhook.id);
      } catch (err) {
        this.log.error({ err, webhookId: this.webhook.id }, "reading the webhook queue failed");
        await this.sleep(this.s.retryInitialMs);
        continue;
      }
      if (!head) {
        this.depth = 0;
        this.idle = true;
        await this.sleep(Infinity);
        continue;
      }
      const wait = head.nextAt - this.now();
      if (wait > 0) {
        await this.sleep(wait);
        continue;
      }
      await this.deliver(head);
    }
  }

  private async deliver(q: QueuedEvent): Promise<void> {
    const w = this.webhook;
    const id = randomUUID();
    const at = this.now();
    const t0 = performance.now();
    let status: number | null = null;
    let responseBody: string | null = null;
    let errorClass: string | null = null;
    let errorText: string | null = null;
    try {
      const res = await fetch(w.url, {
        method: "POST",
        body: q.body,
        redirect: "manual",
        headers: {
          "content-type": "application/json",
          [WEBHOOK_ID_HEADER]: w.id,
          [DELIVERY_ID_HEADER]: id,
          [SIGNATURE_VERSION_HEADER]: SIGNATURE_VERSION,
          [SIGNATURE_HEADER]: webhookSignature(w.secret, q.body),
        },
        signal: AbortSignal.any([this.abort.signal, AbortSignal.timeout(this.s.timeoutMs)]),
      });
      status = res.status;
      responseBody = await bodyPrefix(res, this.s.responseBodyBytes);
      if (status < 200 || status > 299) {
        errorClass = "http_error";
        errorText = `the receiver answered ${status}`;
      }
    } catch (e) {
      if (this.stopped) return; // shutting down: not an attempt, the event stays queued as it was
      errorClass = errorClassOf(e);
      errorText = errorMessage(e);
    }
    const ok = errorClass === null;
    const attempt: DeliveryAttempt = {
      id,
      webhookId: w.id,
      eventId: q.event.id,
      eventType: q.event.type,
      sandboxId: q.event.sandboxId,
      status: ok ? "success" : "failed",
      at,
      durationMs: Math.round(performance.now() - t0),
      requestUrl: w.url,
      responseStatus: status,
      responseBody,
      errorClass,
      errorMessage: errorText,
    };
    try {
      this.store.logAttempt(attempt);
      if (ok) {
        if (this.store.delivered(w.id, q.seq)) this.depth = Math.max(0, this.depth - 1);
      } else {
        const attempts = q.attempts + 1;
        const wait = backoffMs(attempts, this.s.retryInitialMs, this.s.retryMaxMs);
        this.store.retryLater(w.id, q.seq, attempts, this.now() + wait);
        if (attempts === 1 || attempts % 10 === 0) this.log.warn({ webhookId: w.id, eventId: q.event.id, attempts, retryInMs: wait, errorClass, err: errorText }, "webhook delivery failed; retrying");
      }
    } catch (err) {
      this.log.error({ err, webhookId: w.id }, "recording a webhook delivery failed");
      await this.sleep(this.s.retryInitialMs);
    }
  }
}

/**
 * Owns the lanes; the recorder's EventSink (who subscribes to a type, wake the lanes). Told of
 * every webhook change (`changed`), so its view of subscriptions is never read from the database
 * on the API's path.
 */
export class WebhookDispatcher implements EventSink {
  private readonly lanes = new Map<string, Lane>();
  /** Events dropped per webhook because its queue was full (reported in the log, kept for tests). */
  readonly dropped = new Map<string, number>();
  private started = false;

  constructor(
    private readonly store: WebhookStore,
    private readonly cfg: EventsConfig,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {}

  /** Start a lane for every enabled webhook (events queued before a restart go out first). */
  start(): void {
    if (this.started) return;
    this.started = true;
    for (const w of this.store.list()) if (w.enabled) this.lanes.set(w.id, this.lane(w));
  }

  subscribers(type: EventType): string[] {
    const out: string[] = [];
    for (const [id, lane] of this.lanes) if (lane.webhook.events.includes(type)) out.push(id);
    return out;
  }

  queued(webhookIds: readonly string[]): void {
    for (const id of webhookIds) {
      const lane = this.lanes.get(id);
      if (!lane) continue;
      lane.depth++;
      if (lane.depth > this.cfg.queueMax) {
        const gone = this.store.dropOldest(id, lane.depth - this.cfg.queueMax);
        lane.depth -= gone;
        const total = (this.dropped.get(id) ?? 0) + gone;
        this.dropped.set(id, total);
        if (total === gone || total % 1000 < gone) this.log.warn({ webhookId: id, dropped: total, queueMax: this.cfg.queueMax }, "webhook queue full: its oldest waiting events were dropped ([events] webhook_queue_max)");
      }
      if (lane.idle) lane.poke();
    }
  }

  /**
   * Webhook `id` was created, changed (`w`) or deleted (null). A disabled or deleted webhook's
   * lane stops and its waiting events go; a changed one delivers with its new URL and secret.
   */
  async changed(id: string, w: WebhookRecord | null): Promise<void> {
    const lane = this.lanes.get(id);
    if (w?.enabled) {
      if (lane) lane.webhook = w;
      else if (this.started) this.lanes.set(id, this.lane(w));
      return;
    }
    if (lane) {
      this.lanes.delete(id);
      await lane.stop();
    }
    if (w) this.store.clearQueue(id);
  }

  /**
   * Count every lane's queue again from the table: after the retention scan deleted events, their
   * queued deliveries went with them, and a count left high would drop events for room they have.
   */
  recount(): void {
    for (const [id, lane] of this.lanes) lane.depth = this.store.queueDepth(id);
  }

  /** Events waiting for webhook `id` (0 for a disabled or unknown one). */
  depth(id: string): number {
    return this.lanes.get(id)?.depth ?? 0;
  }

  /** Stop every lane (deliveries in flight are cancelled; queues stay on disk). */
  async close(): Promise<void> {
    this.started = false;
    const lanes = [...this.lanes.values()];
    this.lanes.clear();
    await Promise.all(lanes.map((l) => l.stop()));
  }

  private lane(w: WebhookRecord): Lane {
    return new Lane(w, this.store, this.cfg, this.log, this.now);
  }
}
