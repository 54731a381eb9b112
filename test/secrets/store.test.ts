/**
 * src/secrets: names and ids as E2B defines them, the store's operations and limits, and
 * encryption at rest: the database file never holds a value, the key file is made 0600 and a
 * key file others may read is refused; a value sealed under one key does not open under another.
 */
import { afterAll, expect, test } from "bun:test";
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openDb } from "../../src/db/index.ts";
import { isSecretId, newSecretId, normalizeName, parseSelector, SecretCipher, SecretsError, SecretStore, typeIdSuffix } from "../../src/secrets/index.ts";

const dir = mkdtempSync(join(tmpdir(), "secrets-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function thrown(fn: () => unknown): SecretsError {
  try {
    fn();
  } catch (e) {
    if (e instanceof SecretsError) return e;
    throw e;
  }
  throw new Error("expected a SecretsError");
}

test("names are trimmed, checked and lower-cased; ids are sec_ + a 26-character TypeID", () => {
  expect(normalizeName("  My-Secret_1 ")).toBe("my-secret_1");
  for (const bad of ["", "my secret", "a".repeat(129), "sec_abc", "SEC_x", "naïve"]) expect(thrown(() => normalizeName(bad)).details.field).toBe("name");
  const id = newSecretId();
  expect(id).toMatch(/^sec_[0-7][0-9a-hjkmnp-tv-z]{25}$/);
  expect(isSecretId(id)).toBe(true);
  // TypeID of the all-zero and all-ones UUIDs
  expect(typeIdSuffix(new Uint8Array(16))).toBe("0".repeat(26));
  expect(typeIdSuffix(new Uint8Array(16).fill(255))).toBe("7" + "z".repeat(25));
  expect(parseSelector(` ${id.toUpperCase()} `)).toEqual({ id });
  expect(parseSelector("  My-Secret  ")).toEqual({ name: "my-secret" });
  expect(thrown(() => parseSelector(" SEC_FOO ")).details.field).toBe("secretID");
  expect(thrown(() => parseSelector("my secret")).details.field).toBe("secretID");
});

test("create, get by id and name, update (new version, metadata kept or replaced), list pages, destroy", () => {
  const db = openDb(":memory:");
  let t = 1000;
  const store = new SecretStore(db, SecretCipher.fromKey(new Uint8Array(32).fill(7)), 3, () => t++);
  const a = store.create("Alpha", "value-a", { team: "x" });
  expect(a).toMatchObject({ name: "alpha", currentVersion: 1, metadata: { team: "x" }, createdAt: 1000, updatedAt: 1000 });
  expect(store.get(a.secretID)).toEqual(a);
  expect(store.get("ALPHA")).toEqual(a);
  expect(thrown(() => store.create("alpha", "other")).code).toBe("secrets.conflict");
  const u = store.update("alpha", "value-a2");
  expect([u.currentVersion, u.metadata, u.createdAt, u.updatedAt]).toEqual([2, { team: "x" }, 1000, 1001]);
  expect(store.update(a.secretID, "value-a3", {}).metadata).toEqual({});
  store.create("beta", "value-b");
  store.create("gamma", "value-c");
  expect(thrown(() => store.create("delta", "value-d")).details).toEqual({ limit: 3 });
  const p1 = store.list(2);
  expect(p1.items.map((s) => s.name)).toEqual(["alpha", "beta"]);
  const p2 = store.list(2, p1.nextToken);
  expect([p2.items.map((s) => s.name), p2.nextToken]).toEqual([["gamma"], undefined]);
  expect(thrown(() => store.list(0)).details.field).toBe("limit");
  expect(thrown(() => store.list(2, "garbage")).details.field).toBe("nextToken");
  expect(store.destroy("beta")).toBe(true);
  expect(store.destroy("beta")).toBe(false);
  expect(thrown(() => store.get("beta")).code).toBe("secrets.not_found");
  expect(thrown(() => store.update("nope", "v")).code).toBe("secrets.not_found");
  // the name is free again
  expect(store.create("beta", "value-b2").currentVersion).toBe(1);
  db.close();
});

test("values and metadata within E2B's limits; errors never quote a value", async () => {
  const db = openDb(":memory:");
  const store = new SecretStore(db, SecretCipher.fromKey(new Uint8Array(32).fill(1)), 100);
  const big = "V".repeat(65_537);
  const e = thrown(() => store.create("big", big));
  expect([e.details.field, e.message.includes("VVVV")]).toEqual(["value", false]);
  expect(thrown(() => store.create("empty", "")).details.field).toBe("value");
  expect(thrown(() => store.create("num", 5)).details.field).toBe("value");
  expect(store.create("max", "V".repeat(65_536)).currentVersion).toBe(1);
  const many = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, "v"]));
  expect(thrown(() => store.create("meta", "v", many)).details.field).toBe("metadata");
  expect(thrown(() => store.create("meta", "v", { k: "x".repeat(1025) })).details.field).toBe("metadata");
  expect(thrown(() => store.create("meta", "v", { k: 1 })).details.field).toBe("metadata");
  expect(await store.resolve("MAX")).toBe("V".repeat(65_536));
  expect(await store.resolve("absent")).toBeNull();
  expect(await store.resolve("not a name")).toBeNull();
  db.close();
});

test("at rest: the database file never holds the value; the key file is made 0600 and one others may read is refused", async () => {
  const keyPath = join(dir, "k", "secrets.key");
  const dbPath = join(dir, "node.db");
  const db = openDb(dbPath);
  const store = new SecretStore(db, SecretCipher.fromKeyFile(keyPath), 10);
  const value = "sk-live-0123456789abcdef-THE-SECRET";
  store.create("api-key", value);
  store.update("api-key", `${value}-v2`);
  db.sqlite.exec("PRAGMA wal_checkpoint(FULL)");
  db.close();
  expect(statSync(keyPath).mode & 0o777).toBe(0o600);
  expect(readFileSync(keyPath, "utf8")).toMatch(/^[0-9a-f]{64}\n$/);
  for (const f of [dbPath, `${dbPath}-wal`]) {
    let bytes: Buffer;
    try {
      bytes = readFileSync(f);
    } catch {
      continue;
    }
    expect(bytes.includes(Buffer.from("THE-SECRET"))).toBe(false);
  }
  // the same key reads it back; another key does not
  const db2 = openDb(dbPath);
  expect(await new SecretStore(db2, SecretCipher.fromKeyFile(keyPath), 10).resolve("api-key")).toBe(`${value}-v2`);
  const other = new SecretStore(db2, SecretCipher.fromKey(new Uint8Array(32).fill(9)), 10);
  const e = await other.resolve("api-key").then(
    () => null,
    (x) => x as SecretsError,
  );
  expect([e?.code, e?.message.includes("THE-SECRET")]).toEqual(["secrets.sealed_corrupt", false]);
  db2.close();
  chmodSync(keyPath, 0o644);
  expect(thrown(() => SecretCipher.fromKeyFile(keyPath)).code).toBe("secrets.key_unusable");
  const junk = join(dir, "junk.key");
  writeFileSync(junk, "not a key\n", { mode: 0o600 });
  expect(thrown(() => SecretCipher.fromKeyFile(junk)).code).toBe("secrets.key_unusable");
});
