/**
 * SchedulerStore in SQLite (bun:sqlite + drizzle, WAL), the default: one file, one scheduler.
 * Hot paths (lookup, roster upserts) use prepared statements.
 */
import { and, count, eq, lt, sql } from "drizzle-orm";
import { drizzle, type BunSQLiteDatabase } from "drizzle-orm/bun-sqlite";
import { openDb, type Db } from "../../../src/db/index.ts";
import { ObservedNode, P2pEndpoint } from "../../../src/cluster/index.ts";
import { SchedulerError } from "../errors.ts";
import type { Binding, NodeReport } from "../types.ts";
import { SCHEDULER_MIGRATIONS } from "./migrations/index.ts";
import * as schema from "./schema.ts";
import type { RosterChange, SchedulerStore } from "./types.ts";
import { errorMessage } from "../../../src/util/error.ts";

const { bindings, nodeReports } = schema;

function wrap<T>(what: string, path: string, fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    throw new SchedulerError("scheduler.store_failed", `scheduler database ${path}: ${what} failed: ${errorMessage(e)}`, { path }, { cause: e });
  }
}

/**
 * SchedulerStore in one SQLite file (migrations in ./migrations, applied at open): tables
 * `bindings` and `node_reports` (schema.ts). One scheduler process per file.
 */
export class SqliteStore implements SchedulerStore {
  readonly kind = "sqlite" as const;
  private readonly db: Db;
  private readonly orm: BunSQLiteDatabase<typeof schema>;
  private readonly getStmt;
  private readonly upsertStmt;

  /**
   * Open (creating) the database at `path` (":memory:" for tests) and apply migrations.
   * @throws DbError when the file cannot be opened or migrated.
   */
  constructor(private readonly path: string) {
    this.db = openDb(path, SCHEDULER_MIGRATIONS);
    this.orm = drizzle({ client: this.db.sqlite, schema });
    this.getStmt = this.orm.select().from(bindings).where(eq(bindings.sandboxId, sql.placeholder("id"))).prepare();
    this.upsertStmt = this.orm
      .insert(bindings)
      .values({ sandboxId: sql.placeholder("sandboxId"), nodeId: sql.placeholder("nodeId"), endpoint: sql.placeholder("endpoint"), updatedAt: sql.placeholder("updatedAt"), held: sql.placeholder("held") })
      .onConflictDoUpdate({
        target: bindings.sandboxId,
        // a binding staying on its node keeps `held`
        set: { held: sql`excluded.held OR (${bindings.held} AND ${bindings.nodeId} = excluded.node_id)`, nodeId: sql`excluded.node_id`, endpoint: sql`excluded.endpoint`, updatedAt: sql`excluded.updated_at` },
      })
      .prepare();
  }

  async getBinding(sandboxId: string): Promise<Binding | null> {
    return wrap("lookup", this.path, () => this.getStmt.get({ id: sandboxId }) ?? null);
  }

  async putBinding(b: Binding): Promise<void> {
    wrap("record", this.path, () => this.upsert(b));
  }

  /** The prepared upsert (booleans as SQLite stores them). */
  private upsert(b: Binding): void {
    this.upsertStmt.run({ ...b, held: b.held ? 1 : 0 });
  }

  async claimBinding(b: Binding): Promise<boolean> {
    return wrap("claim", this.path, () =>
      this.db.sqlite.transaction((): boolean => {
        const cur = this.getStmt.get({ id: b.sandboxId });
        if (cur && cur.nodeId !== b.nodeId && cur.held) return false;
        this.upsert(b);
        return true;
      })(),
    );
  }

  async moveBinding(fromNodeId: string, to: Binding): Promise<Binding | null> {
    return wrap("move", this.path, () =>
      this.db.sqlite.transaction((): Binding | null => {
        const cur = this.getStmt.get({ id: to.sandboxId });
        if (!cur || cur.nodeId !== fromNodeId) return cur ?? null;
        this.upsert(to);
        return this.getStmt.get({ id: to.sandboxId })!;
      })(),
    );
  }

  async deleteBinding(sandboxId: string, nodeId?: string): Promise<boolean> {
    return wrap("delete", this.path, () => {
      const cond = nodeId === undefined ? eq(bindings.sandboxId, sandboxId) : and(eq(bindings.sandboxId, sandboxId), eq(bindings.nodeId, nodeId));
      return this.orm.delete(bindings).where(cond).returning({ id: bindings.sandboxId }).all().length > 0;
    });
  }

  async reconcileRoster(nodeId: string, endpoint: string, roster: string[], now: number, staleBefore: number): Promise<RosterChange> {
    return wrap("roster reconcile", this.path, () =>
      this.db.sqlite.transaction((): RosterChange => {
        let added = 0;
        const foreign: string[] = [];
        for (const id of roster) {
          const cur = this.getStmt.get({ id });
          if (cur && cur.nodeId !== nodeId) {
            // moved to another node while this one was away: that node's, once it holds it
            if (cur.held) foreign.push(id);
            continue;
          }
          if (!cur) added++;
          this.upsert({ sandboxId: id, nodeId, endpoint, updatedAt: now, held: true });
        }
        // diffed here rather than in one NOT IN (...): a roster may exceed SQLite's parameter limit
        const listed = new Set(roster);
        const old = this.orm
          .select({ id: bindings.sandboxId })
          .from(bindings)
          .where(and(eq(bindings.nodeId, nodeId), lt(bindings.updatedAt, staleBefore)))
          .all();
        let removed = 0;
        for (const { id } of old) {
          if (listed.has(id)) continue;
          this.orm.delete(bindings).where(eq(bindings.sandboxId, id)).run();
          removed++;
        }
        return { added, removed, foreign };
      })(),
    );
  }

  async dropNodeBindings(nodeId: string): Promise<number> {
    return wrap("node drop", this.path, () => this.orm.delete(bindings).where(eq(bindings.nodeId, nodeId)).returning({ id: bindings.sandboxId }).all().length);
  }

  /** Sorted. */
  async nodeBindings(nodeId: string): Promise<string[]> {
    return wrap("node bindings", this.path, () =>
      this.orm
        .select({ id: bindings.sandboxId })
        .from(bindings)
        .where(eq(bindings.nodeId, nodeId))
        .orderBy(bindings.sandboxId)
        .all()
        .map((r) => r.id),
    );
  }

  async countBindings(): Promise<number> {
    return wrap("count", this.path, () => this.orm.select({ n: count() }).from(bindings).get()?.n ?? 0);
  }

  async putReport(r: NodeReport): Promise<void> {
    wrap("report write", this.path, () => {
      const row = { nodeId: r.node.nodeId, node: ObservedNode.toJSON(r.node), p2p: r.p2p ? P2pEndpoint.toJSON(r.p2p) : null, lastSeen: r.node.lastSeenUnixMs, leftAt: r.leftAtUnixMs };
      this.orm
        .insert(nodeReports)
        .values(row)
        .onConflictDoUpdate({ target: nodeReports.nodeId, set: { node: row.node, p2p: row.p2p, lastSeen: row.lastSeen, leftAt: row.leftAt } })
        .run();
    });
  }

  async getReport(nodeId: string): Promise<NodeReport | null> {
    return wrap("report read", this.path, () => {
      const row = this.orm.select().from(nodeReports).where(eq(nodeReports.nodeId, nodeId)).get();
      return row ? toReport(row) : null;
    });
  }

  async listReports(): Promise<NodeReport[]> {
    return wrap("report list", this.path, () => this.orm.select().from(nodeReports).orderBy(nodeReports.nodeId).all().map(toReport));
  }

  async deleteReport(nodeId: string): Promise<void> {
    wrap("report delete", this.path, () => this.orm.delete(nodeReports).where(eq(nodeReports.nodeId, nodeId)).run());
  }

  async close(): Promise<void> {
    this.db.close();
  }
}

function toReport(row: { node: unknown; p2p: unknown; leftAt: number | null }): NodeReport {
  return { node: ObservedNode.fromJSON(row.node), p2p: row.p2p ? P2pEndpoint.fromJSON(row.p2p) : null, leftAtUnixMs: row.leftAt };
}
