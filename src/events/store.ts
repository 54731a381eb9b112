/**
 * The node's lifecycle events in its database (table `sandbox_events`): appended as they happen,
 * each in the same transaction as its rows in the webhook queues, so an event is never recorded
 * without its deliveries or the other way round; kept for `[events] retention_hours`.
 * `seq` orders events node-wide: the feed's cursor is a seq (opaque to clients).
 */
import type { Statement } from "bun:sqlite";
import type { Db } from "../db/index.ts";
import { EventsError } from "./errors.ts";
import type { EventQuery, EventType, SandboxLifecycleEvent } from "./types.ts";

interface Row {
  seq: number;
  body: string;
}

/** A page of the node-wide feed: events after a cursor, oldest first, and where to go on from. */
export interface FeedPage {
  events: SandboxLifecycleEvent[];
  /** The cursor of the next page: the last event's, or the one asked with when none came. */
  cursor: number;
}

const parse = (r: Row) => JSON.parse(r.body) as SandboxLifecycleEvent;

/** `?, ?, ...` for `n` values. */
const marks = (n: number) => Array.from({ length: n }, () => "?").join(", ");

export class EventStore {
  private readonly insertEvent: Statement;
  private readonly insertQueued: Statement;

  constructor(private readonly db: Db) {
    this.insertEvent = db.sqlite.prepare("INSERT INTO sandbox_events (id, sandbox_id, type, at, body) VALUES (?, ?, ?, ?, ?)");
    this.insertQueued = db.sqlite.prepare("INSERT INTO webhook_queue (webhook_id, event_seq, attempts, next_at) VALUES (?, ?, 0, ?)");
  }

  /**
   * Record `e` and queue it for delivery to `webhookIds` (due at once), in one transaction.
   * @returns the event's seq
   */
  append(e: SandboxLifecycleEvent, webhookIds: readonly string[], now: number): number {
    return this.db.sqlite.transaction(() => {
      const seq = Number(this.insertEvent.run(e.id, e.sandboxId, e.type, Date.parse(e.timestamp), JSON.stringify(e)).lastInsertRowid);
      for (const w of webhookIds) this.insertQueued.run(w, seq, now);
      return seq;
    })();
  }

  /**
   * Events of sandbox `id` matching `q`.
   * @throws EventsError `events.not_found` when no event of `id` is kept at all (E2B: 404).
   */
  bySandbox(id: string, q: EventQuery): SandboxLifecycleEvent[] {
    const rows = this.select("sandbox_id = ?", [id], q);
    if (rows.length === 0 && !this.db.sqlite.query("SELECT 1 FROM sandbox_events WHERE sandbox_id = ? LIMIT 1").get(id)) {
      throw new EventsError("events.not_found", `Sandbox events not found: no event of sandbox ${id} is kept`, { sandboxId: id });
    }
    return rows.map(parse);
  }

  /** Events of every sandbox matching `q`. */
  list(q: EventQuery): SandboxLifecycleEvent[] {
    return this.select("1 = 1", [], q).map(parse);
  }

  /** Up to `limit` events after `cursor` (0: from the first kept), oldest first, of `types` (empty: all). */
  feed(cursor: number, limit: number, types: readonly EventType[]): FeedPage {
    const typeCond = types.length ? ` AND type IN (${marks(types.length)})` : "";
    const rows = this.db.sqlite.query<Row, (string | number)[]>(`SELECT seq, body FROM sandbox_events WHERE seq > ?${typeCond} ORDER BY seq ASC LIMIT ?`).all(cursor, ...types, limit);
    return { events: rows.map(parse), cursor: rows.length ? rows[rows.length - 1]!.seq : cursor };
  }

  /** The seq of the newest event kept, 0 when none: a feed from it sees only later events. */
  head(): number {
    return this.db.sqlite.query<{ s: number | null }, []>("SELECT max(seq) AS s FROM sandbox_events").get()?.s ?? 0;
  }

  /** The event with id `eventId`, if kept: its JSON as stored (as delivered). */
  bodyOf(eventId: string): string | undefined {
    return this.db.sqlite.query<{ body: string }, [string]>("SELECT body FROM sandbox_events WHERE id = ?").get(eventId)?.body;
  }

  /** The newest event of sandbox `id` among `types`, if kept (the start of its current run). */
  last(id: string, types: readonly EventType[]): SandboxLifecycleEvent | undefined {
    const r = this.db.sqlite
      .query<Row, string[]>(`SELECT seq, body FROM sandbox_events WHERE sandbox_id = ? AND type IN (${marks(types.length)}) ORDER BY seq DESC LIMIT 1`)
      .get(id, ...types);
    return r ? parse(r) : undefined;
  }

  /** Delete events recorded before `before` (unix ms), their queued deliveries with them. @returns how many */
  prune(before: number): number {
    return this.db.sqlite.query("DELETE FROM sandbox_events WHERE at < ?").run(before).changes;
  }

  private select(where: string, args: string[], q: EventQuery): Row[] {
    const typeCond = q.types.length ? ` AND type IN (${marks(q.types.length)})` : "";
    const sql = `SELECT seq, body FROM sandbox_events WHERE ${where}${typeCond} ORDER BY seq ${q.orderAsc ? "ASC" : "DESC"} LIMIT ? OFFSET ?`;
    return this.db.sqlite.query<Row, (string | number)[]>(sql).all(...args, ...q.types, q.limit, q.offset);
  }
}
