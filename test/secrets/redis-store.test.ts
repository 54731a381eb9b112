/**
 * The secrets store in Redis (RedisSecretStore), against Debian's redis-server started by this test
 * on 127.0.0.1 (its own data directory, RDB uncompressed) and killed by pid after: two stores over
 * one Redis see each other's secrets, a new store (a restarted gateway) and a restarted Redis keep
 * them, Redis holds only ciphertext (checked on its keys and on its RDB file), and a store with
 * another key, a missing key file, a swapped record or an unreachable Redis fails with its code.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { RedisClient } from "bun";
import { RedisSecretStore, SecretCipher, SecretsError } from "../../src/secrets/index.ts";
import { freePort, startRedis, type TestRedis } from "../services/helpers.ts";

const dir = mkdtempSync("/tmp/aenv-secrets-redis-");
const REDIS_ARGS = ["--dir", dir, "--dbfilename", "dump.rdb", "--rdbcompression", "no", "--loglevel", "warning"];
const KEY = randomBytes(32);
let redis: TestRedis;
const open: RedisSecretStore[] = [];

beforeAll(async () => {
  redis = await startRedis(REDIS_ARGS);
});
afterAll(async () => {
  for (const s of open) s.close();
  await redis?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const store = (prefix: string, key: Uint8Array = KEY, url = redis.url, maxSecrets = 1000) => {
  const s = new RedisSecretStore({ url, prefix, connectTimeoutMs: 3000, maxSecrets }, SecretCipher.fromKey(key));
  open.push(s);
  return s;
};
const prefix = () => `t${randomBytes(4).toString("hex")}:`;
const failure = async (p: Promise<unknown>) =>
  p.then(
    () => null,
    (e) => e as SecretsError,
  );

test("two stores over one Redis see each other's creates, updates, listings and destroys", async () => {
  const p = prefix();
  const a = store(p);
  const b = store(p);
  const made = await a.create("OpenAI", "sk-first-value", { team: "x" });
  expect(made.name).toBe("openai");
  expect(await b.get("openai")).toEqual(made);
  expect(await b.get(made.secretID)).toEqual(made);
  expect(await b.resolve("OPENAI")).toBe("sk-first-value");
  // b updates (metadata kept when not given); a sees version 2 and the new value at once
  const up = await b.update("openai", "sk-second-value");
  expect([up.currentVersion, up.metadata, up.createdAt]).toEqual([2, { team: "x" }, made.createdAt]);
  expect((await a.get("openai")).currentVersion).toBe(2);
  expect(await a.resolve("openai")).toBe("sk-second-value");
  // metadata {} replaces
  expect((await a.update(made.secretID, "sk-third-value", {})).metadata).toEqual({});
  // names are unique across the stores
  expect((await failure(b.create("openai", "v")))?.code).toBe("secrets.conflict");
  // a listing paged through both: a's token works on b, oldest first
  await b.create("second", "v2");
  await a.create("third", "v3");
  const p1 = await a.list(2);
  expect(p1.items.map((s) => s.name)).toEqual(["openai", "second"]);
  const p2 = await b.list(2, p1.nextToken);
  expect([p2.items.map((s) => s.name), p2.nextToken]).toEqual([["third"], undefined]);
  expect((await failure(b.list(2, "bm9wZQ")))?.code).toBe("secrets.bad_request");
  expect((await failure(b.list(0)))?.code).toBe("secrets.bad_request");
  // a destroys; b no longer finds it, and the name is free again
  expect(await a.destroy("openai")).toBe(true);
  expect(await a.destroy("openai")).toBe(false);
  expect((await failure(b.get("openai")))?.code).toBe("secrets.not_found");
  expect((await failure(b.update("openai", "x")))?.code).toBe("secrets.not_found");
  expect(await b.resolve("openai")).toBeNull();
  expect((await b.create("openai", "again")).currentVersion).toBe(1);
  expect((await b.list()).items.map((s) => s.name)).toEqual(["second", "third", "openai"]);
  // bad input is refused before Redis is asked
  expect((await failure(a.create("sec_x", "v")))?.details.field).toBe("name");
  expect((await failure(a.create("ok", "")))?.details.field).toBe("value");
  expect((await failure(a.create("ok", "v", { k: 1 })))?.details.field).toBe("metadata");
});

test("max_secrets holds across the stores", async () => {
  const p = prefix();
  const a = store(p, KEY, redis.url, 2);
  const b = store(p, KEY, redis.url, 2);
  await a.create("one", "1");
  await b.create("two", "2");
  const e = await failure(a.create("three", "3"));
  expect([e?.code, e?.details.limit]).toEqual(["secrets.conflict", 2]);
  expect((await b.list()).items.length).toBe(2);
});

test("a restarted gateway and a restarted Redis keep the secrets; Redis holds only ciphertext", async () => {
  const p = prefix();
  const plain = `plain-${randomBytes(12).toString("hex")}`;
  const first = store(p);
  const s = await first.create("restart-me", plain, { owner: "ops" });
  first.close();
  // a new store (a restarted or another replica) with the same key reads it back
  const again = store(p);
  expect(await again.get("restart-me")).toEqual(s);
  expect(await again.resolve("restart-me")).toBe(plain);

  // every key of the store, read back: no field holds the value, raw or decoded
  const c = new RedisClient(redis.url);
  try {
    const keys = ((await c.send("KEYS", [`${p}*`])) as string[]).sort();
    expect(keys).toEqual([`${p}keycheck`, `${p}names`, `${p}order`, `${p}s:${s.secretID}`].sort());
    const record = await c.hgetall(`${p}s:${s.secretID}`);
    expect(Object.keys(record).sort()).toEqual(["created", "metadata", "name", "order", "sealed", "updated", "version"]);
    const sealed = Buffer.from(record.sealed!, "base64");
    // iv (12) | tag (16) | ciphertext as long as the value
    expect(sealed.length).toBe(12 + 16 + Buffer.byteLength(plain));
    for (const v of Object.values(record)) {
      expect(v.includes(plain)).toBe(false);
      expect(Buffer.from(v, "base64").includes(Buffer.from(plain))).toBe(false);
    }
    // Redis's own file of the data (uncompressed): the name is there, the value is not
    await c.send("SAVE", []);
  } finally {
    c.close();
  }
  const rdb = readFileSync(join(dir, "dump.rdb"));
  expect(rdb.includes(Buffer.from("restart-me"))).toBe(true);
  expect(rdb.includes(Buffer.from(`${p}s:${s.secretID}`))).toBe(true);
  expect(rdb.includes(Buffer.from(plain))).toBe(false);

  // Redis restarted on its data: the secret is still there and opens
  again.close();
  await redis.stop();
  redis = await startRedis(REDIS_ARGS);
  const after = store(p);
  expect(await after.get(s.secretID)).toEqual(s);
  expect(await after.resolve("restart-me")).toBe(plain);
});

test("another key is refused with key_mismatch on every call; a swapped record does not open", async () => {
  const p = prefix();
  const good = store(p);
  await good.create("k", "the-value");
  const bad = store(p, randomBytes(32));
  for (const call of [bad.get("k"), bad.resolve("k"), bad.list(), bad.create("other", "v"), bad.update("k", "x"), bad.destroy("k")]) {
    const e = await failure(call);
    expect(e).toBeInstanceOf(SecretsError);
    expect([e?.code, e?.details.prefix]).toEqual(["secrets.key_mismatch", p]);
    expect(e?.message.includes("the-value")).toBe(false);
  }
  // nothing changed through the refused calls
  expect((await good.list()).items.map((s) => [s.name, s.currentVersion])).toEqual([["k", 1]]);
  // a value moved to another secret's record does not open (sealed to its id)
  const other = await good.create("other", "other-value");
  const c = new RedisClient(redis.url);
  try {
    const kId = (await good.get("k")).secretID;
    const sealedK = (await c.hget(`${p}s:${kId}`, "sealed"))!;
    await c.hset(`${p}s:${other.secretID}`, { sealed: sealedK });
    const e = await failure(good.resolve("other"));
    expect([e?.code, e?.details.secret]).toEqual(["secrets.sealed_corrupt", other.secretID]);
  } finally {
    c.close();
  }
});

test("a shared store never makes a key: a missing key file is key_unusable and stays missing", () => {
  const path = join(dir, "absent", "secrets.key");
  let e: unknown;
  try {
    SecretCipher.fromKeyFile(path, false);
  } catch (x) {
    e = x;
  }
  expect(e).toBeInstanceOf(SecretsError);
  expect([(e as SecretsError).code, (e as SecretsError).details.path]).toEqual(["secrets.key_unusable", path]);
  expect(existsSync(path)).toBe(false);
});

test("an unreachable Redis is store_failed, with the password redacted", async () => {
  const s = store(prefix(), KEY, `redis://user:hunter2@127.0.0.1:${freePort()}`);
  const e = await failure(s.get("k"));
  expect(e?.code).toBe("secrets.store_failed");
  expect(e?.details.url).toMatch(/^redis:\/\/user:\*\*\*@127\.0\.0\.1:\d+$/);
  expect(e?.message.includes("hunter2")).toBe(false);
  // tried again at the next call (a failure to connect is not remembered as a verdict)
  expect((await failure(s.resolve("k")))?.code).toBe("secrets.store_failed");
});
