/**
 * The node's SQLite database (bun:sqlite + drizzle-orm): WAL, foreign keys, busy timeout,
 * migrations applied at open. State that must survive a restart (sandboxes, slots, snapshots)
 * lives here.
 */
import { Database } from "bun:sqlite";
import { drizzle, type BunSQLiteDatabase } from "drizzle-orm/bun-sqlite";
import { AgentEnvError, type ErrorTable } from "../errors.ts";
import { MIGRATIONS, type Migration } from "./migrations/index.ts";
export { SECRETS_MIGRATIONS } from "./migrations/index.ts";
import * as schema from "./schema/index.ts";
import { errorMessage } from "../util/error.ts";

/** Database failures. Adding a code: see src/errors.ts. */
export const DB_ERRORS = {
  "db.open_failed": "the database file cannot be opened (details.path)",
  "db.migration_failed": "a migration failed (details.path, migration)",
} as const satisfies ErrorTable;
/** A DbError code. */
export type DbErrorCode = keyof typeof DB_ERRORS;

/** Thrown when the database cannot be opened or a migration fails. */
export class DbError extends AgentEnvError<DbErrorCode> {}

/** An open database: the drizzle handle and the raw bun:sqlite connection. */
export interface Db {
  orm: BunSQLiteDatabase<typeof schema>;
  sqlite: Database;
  close(): void;
}

/**
 * Open (creating if needed) the database at `path` (":memory:" for tests) and apply pending
 * migrations.
 * @throws DbError naming the file and the migration at fault.
 */
export function openDb(path: string, migrations: Migration[] = MIGRATIONS): Db {
  let sqlite: Database;
  try {
    sqlite = new Database(path, { create: true, strict: true });
    sqlite.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; PRAGMA busy_timeout=5000;");
  } catch (e) {
    throw new DbError("db.open_failed", `cannot open database ${path}: ${errorMessage(e)}`, { path });
  }
  applyMigrations(sqlite, migrations, path);
  const orm = drizzle({ client: sqlite, schema });
  return { orm, sqlite, close: () => sqlite.close() };
}

function applyMigrations(sqlite: Database, migrations: Migration[], path: string): void {
  sqlite.exec("CREATE TABLE IF NOT EXISTS __migrations (tag TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)");
  const done = new Set(sqlite.query<{ tag: string }, []>("SELECT tag FROM __migrations").all().map((r) => r.tag));
  for (const m of migrations) {
    if (done.has(m.tag)) continue;
    try {
      sqlite.transaction(() => {
        for (const stmt of m.sql.split("--> statement-breakpoint")) {
          if (stmt.trim()) sqlite.exec(stmt);
        }
        sqlite.query("INSERT INTO __migrations (tag, applied_at) VALUES (?, ?)").run(m.tag, Date.now());
      })();
    } catch (e) {
      throw new DbError("db.migration_failed", `migration ${m.tag} failed on ${path}: ${errorMessage(e)}`, { path, tag: m.tag });
    }
  }
}
