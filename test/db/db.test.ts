import { expect, test } from "bun:test";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DbError, openDb } from "../../src/db/index.ts";

test("migrations apply once, in order, and survive reopen; WAL is on", () => {
  const file = join(mkdtempSync(join(tmpdir(), "db-")), "node.db");
  const migs = [
    { tag: "0000_a", sql: "CREATE TABLE t (x INTEGER);\n--> statement-breakpoint\nINSERT INTO t VALUES (1);" },
    { tag: "0001_b", sql: "INSERT INTO t VALUES (2);" },
  ];
  const db = openDb(file, migs);
  expect(db.sqlite.query("PRAGMA journal_mode").get()).toEqual({ journal_mode: "wal" });
  db.close();
  const again = openDb(file, migs);
  expect(again.sqlite.query("SELECT x FROM t ORDER BY x").all()).toEqual([{ x: 1 }, { x: 2 }]);
  again.close();
});

test("a failing migration is a DbError and rolls back", () => {
  const file = join(mkdtempSync(join(tmpdir(), "db-")), "node.db");
  expect(() => openDb(file, [{ tag: "0000_bad", sql: "CREATE TABLE t (x);\n--> statement-breakpoint\nNOT SQL" }])).toThrow(DbError);
  const db = openDb(file, []);
  expect(db.sqlite.query("SELECT name FROM sqlite_master WHERE name = 't'").all()).toEqual([]);
  db.close();
});
