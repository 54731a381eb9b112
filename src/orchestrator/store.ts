/**
 * Persistence of sandbox records in the node database (drizzle over bun:sqlite, WAL).
 * Every state change is written before the orchestrator reports it, so a restarted node sees
 * the last state each sandbox reached.
 */
import { and, asc, desc, eq, gt, gte, inArray, lt, lte, or, sql } from "drizzle-orm";
import type { Db } from "../db/index.ts";
import { sandboxes, templateSpawns } from "../db/schema/sandboxes.ts";
import { parseState, type SandboxState } from "./states.ts";
import type { SandboxRecord } from "./types.ts";

type Row = typeof sandboxes.$inferSelect;

function toRecord(r: Row): SandboxRecord {
  return { ...r, state: parseState(r.id, r.state) } as SandboxRecord;
}

/** Keyset cursor of a list page: (startedAt, id) of the last row returned. */
export interface ListCursor {
  startedAt: number;
  id: string;
}

export class SandboxStore {
  constructor(private readonly db: Db) {}

  /** Insert a new record. */
  insert(rec: SandboxRecord): void {
    this.db.orm.insert(sandboxes).values(rec).run();
  }

  /**
   * Insert `rec` unless a live record of its id exists; an ended one (killed, failed) is replaced
   * (a sandbox that was here before, moved away, and comes back).
   * @returns whether `rec` was stored
   */
  insertOrReplaceEnded(rec: SandboxRecord): boolean {
    return this.db.sqlite.transaction((): boolean => {
      const cur = this.get(rec.id);
      if (cur && cur.state !== "killed" && cur.state !== "failed") return false;
      if (cur) this.db.orm.delete(sandboxes).where(eq(sandboxes.id, rec.id)).run();
      this.insert(rec);
      return true;
    })();
  }

  /** The record of `id`, or undefined. */
  get(id: string): SandboxRecord | undefined {
    const r = this.db.orm.select().from(sandboxes).where(eq(sandboxes.id, id)).get();
    return r ? toRecord(r) : undefined;
  }

  /** Update fields of `id` (updatedAt is set here). @returns the record after the update, undefined when `id` has none. */
  update(id: string, fields: Partial<Omit<SandboxRecord, "id">>, now: number): SandboxRecord | undefined {
    const r = this.db.orm.update(sandboxes).set({ ...fields, updatedAt: now }).where(eq(sandboxes.id, id)).returning().get();
    return r ? toRecord(r) : undefined;
  }

  /** Records in any of `states`. */
  inStates(states: readonly SandboxState[]): SandboxRecord[] {
    return this.db.orm.select().from(sandboxes).where(inArray(sandboxes.state, [...states])).all().map(toRecord);
  }

  /** Count of records per state. */
  countByState(): Record<string, number> {
    const rows = this.db.orm.select({ state: sandboxes.state, n: sql<number>`count(*)` }).from(sandboxes).groupBy(sandboxes.state).all();
    return Object.fromEntries(rows.map((r) => [r.state, r.n]));
  }

  /** Ids of running sandboxes whose endAt is at or before `now`. */
  expired(now: number): { id: string; autoPause: boolean; autoPauseMemory: boolean }[] {
    return this.db.orm
      .select({ id: sandboxes.id, autoPause: sandboxes.autoPause, autoPauseMemory: sandboxes.autoPauseMemory })
      .from(sandboxes)
      .where(and(eq(sandboxes.state, "running"), lte(sandboxes.endAt, now)))
      .all();
  }

  /**
   * The earliest endAt (unix ms) of running sandboxes other than `skip`, or null when there is
   * none.
   */
  nextExpiry(skip: ReadonlySet<string>): number | null {
    const rows = this.db.orm
      .select({ id: sandboxes.id, endAt: sandboxes.endAt })
      .from(sandboxes)
      .where(eq(sandboxes.state, "running"))
      .orderBy(asc(sandboxes.endAt))
      .limit(skip.size + 1)
      .all();
    return rows.find((r) => !skip.has(r.id))?.endAt ?? null;
  }

  /**
   * One page of records in `states`, ordered by (startedAt, id), after `cursor`; filters that
   * SQL cannot express (metadata) are applied by `keep`, so a page may be built from several
   * batches. Returns up to `limit` rows and whether more exist.
   */
  page(opts: {
    states: readonly SandboxState[];
    order: "asc" | "desc";
    limit: number;
    cursor?: ListCursor;
    template?: string;
    startedAfter?: number;
    keep: (r: SandboxRecord) => boolean;
  }): { items: SandboxRecord[]; more: boolean } {
    const items: SandboxRecord[] = [];
    let cursor = opts.cursor;
    const batch = Math.max(opts.limit + 1, 64);
    for (;;) {
      const conds = [inArray(sandboxes.state, [...opts.states])];
      if (opts.template) conds.push(or(eq(sandboxes.templateId, opts.template), eq(sandboxes.alias, opts.template))!);
      // E2B: "started at or after this timestamp"
      if (opts.startedAfter !== undefined) conds.push(gte(sandboxes.startedAt, opts.startedAfter));
      if (cursor) {
        const c = cursor;
        const cmp = opts.order === "asc" ? gt : lt;
        conds.push(or(cmp(sandboxes.startedAt, c.startedAt), and(eq(sandboxes.startedAt, c.startedAt), cmp(sandboxes.id, c.id)))!);
      }
      const dir = opts.order === "asc" ? asc : desc;
      const rows = this.db.orm.select().from(sandboxes).where(and(...conds)).orderBy(dir(sandboxes.startedAt), dir(sandboxes.id)).limit(batch).all();
      for (const row of rows) {
        const rec = toRecord(row);
        if (!opts.keep(rec)) continue;
        if (items.length === opts.limit) return { items, more: true };
        items.push(rec);
      }
      if (rows.length < batch) return { items, more: false };
      const last = rows[rows.length - 1]!;
      cursor = { startedAt: last.startedAt, id: last.id };
    }
  }

  /** Delete killed/failed records last updated before `before`; returns how many. */
  prune(before: number): number {
    const res = this.db.sqlite.query("DELETE FROM sandboxes WHERE state IN ('killed','failed') AND updated_at < ?").run(before);
    return res.changes;
  }

  /** Count one sandbox created from `templateId` at `at` (unix ms). */
  recordSpawn(templateId: string, at: number): void {
    this.db.orm
      .insert(templateSpawns)
      .values({ templateId, spawnCount: 1, lastSpawnedAt: at })
      .onConflictDoUpdate({ target: templateSpawns.templateId, set: { spawnCount: sql`${templateSpawns.spawnCount} + 1`, lastSpawnedAt: at } })
      .run();
  }

  /** Spawn statistics per template id (templates never spawned are absent). */
  spawnStats(): Map<string, { spawnCount: number; lastSpawnedAt: number }> {
    return new Map(this.db.orm.select().from(templateSpawns).all().map((r) => [r.templateId, { spawnCount: r.spawnCount, lastSpawnedAt: r.lastSpawnedAt }]));
  }
}
