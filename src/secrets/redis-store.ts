/**
 * The secrets store in Redis (Bun's built-in RedisClient), shared by every gateway replica of a
 * cluster (`[secrets] store = "redis"`): a secret one replica creates is seen by the others at
 * once, and a restart loses none. Values reach Redis only sealed (AES-256-GCM, SecretCipher, the
 * key of `[secrets] key_path`, which never goes to Redis). Layout under the prefix P:
 *   P s:<id>      hash: name, version, sealed (base64 of iv|tag|ciphertext), metadata (JSON),
 *                 created, updated (unix ms), order (its member of P order)
 *   P names       hash: name -> id
 *   P order       sorted set, every score 0: "<created, 16 digits>.<id>" (oldest first, by lex)
 *   P keycheck    a fixed text sealed with the key of the first process that used the store;
 *                 a process whose key does not open it refuses every call (secrets.key_mismatch)
 * Changes to more than one key run as one Lua script (atomic on the server); keys are built
 * inside the scripts, so the store needs one Redis (not Redis Cluster).
 */
import { RedisClient } from "bun";
import { redactUrl } from "../util/proxy.ts";
import { errorMessage } from "../util/error.ts";
import type { SecretCipher } from "./cipher.ts";
import { SecretsError } from "./errors.ts";
import { newSecretId, normalizeName, parseSelector } from "./names.ts";
import { checkLimit, checkMetadata, checkValue, decodePageToken, encodePageToken, notFound, type SecretInfo, type SecretKeeper, type SecretPage } from "./store.ts";

// ARGV: prefix, id, name, sealed, metadata, now, max, order -> 0 created, 1 name taken, 2 full
const CREATE = `
local p = ARGV[1]
if redis.call('HEXISTS', p .. 'names', ARGV[3]) == 1 then return 1 end
if redis.call('ZCARD', p .. 'order') >= tonumber(ARGV[7]) then return 2 end
redis.call('HSET', p .. 's:' .. ARGV[2], 'name', ARGV[3], 'version', 1, 'sealed', ARGV[4], 'metadata', ARGV[5], 'created', ARGV[6], 'updated', ARGV[6], 'order', ARGV[8])
redis.call('HSET', p .. 'names', ARGV[3], ARGV[2])
redis.call('ZADD', p .. 'order', 0, ARGV[8])
return 0`;

// ARGV: prefix, id, sealed, now, has metadata ("1"/"0"), metadata -> the record's fields, or nil
const UPDATE = `
local key = ARGV[1] .. 's:' .. ARGV[2]
if redis.call('EXISTS', key) == 0 then return false end
redis.call('HINCRBY', key, 'version', 1)
redis.call('HSET', key, 'sealed', ARGV[3], 'updated', ARGV[4])
if ARGV[5] == '1' then redis.call('HSET', key, 'metadata', ARGV[6]) end
return redis.call('HMGET', key, 'name', 'version', 'metadata', 'created', 'updated')`;

// ARGV: prefix, id -> 1 removed, 0 none
const DESTROY = `
local p = ARGV[1]
local key = p .. 's:' .. ARGV[2]
local r = redis.call('HMGET', key, 'name', 'order')
if not r[1] then return 0 end
redis.call('DEL', key)
if redis.call('HGET', p .. 'names', r[1]) == ARGV[2] then redis.call('HDEL', p .. 'names', r[1]) end
redis.call('ZREM', p .. 'order', r[2])
return 1`;

const INFO_FIELDS = ["name", "version", "metadata", "created", "updated"];
/** Additional data of the key check (never a secret id: those start with `sec_`). */
const KEYCHECK_ID = "agentenv:keycheck";
const KEYCHECK_TEXT = "agentenv secrets key check v1";

/** Where RedisSecretStore keeps its records. */
export interface RedisSecretsOptions {
  /** redis://[user:password@]host:port[/db] */
  url: string;
  /** Prefix of every key (`[secrets] redis_prefix`). */
  prefix: string;
  /** Bound on connecting, ms (`[secrets] redis_connect_timeout_ms`). */
  connectTimeoutMs: number;
  /** Most secrets the store holds (`[secrets] max_secrets`). */
  maxSecrets: number;
}

/** A listing position as a member of P order: the creation time padded so lex order is time order. */
const orderMember = (t: number, id: string) => `${String(t).padStart(16, "0")}.${id}`;

/**
 * Secrets in one Redis, sealed by `cipher`. Connects lazily (and again after a lost connection,
 * at the next call); every call first checks that `cipher` holds the key the store's records
 * were sealed with. Calls reject with SecretsError: `store_failed` (Redis unreachable, a record
 * this code cannot read), `key_mismatch`, and the codes SecretStore documents.
 */
export class RedisSecretStore implements SecretKeeper {
  private readonly client: RedisClient;
  private readonly url: string;
  private keyChecked: Promise<void> | null = null;

  constructor(
    private readonly o: RedisSecretsOptions,
    private readonly cipher: SecretCipher,
    private readonly now: () => number = Date.now,
  ) {
    this.url = redactUrl(o.url);
    this.client = new RedisClient(o.url, { autoReconnect: false, enableOfflineQueue: false, connectionTimeout: o.connectTimeoutMs });
  }

  /**
   * Check that Redis answers and that this process's key opens the store's records (the first
   * process to use an empty store leaves its key check there).
   * @throws SecretsError store_failed, key_mismatch
   */
  checkKey(): Promise<void> {
    // a failed check is tried again at the next call (Redis may come back; a key does not change)
    this.keyChecked ??= this.readKeyCheck().catch((e: unknown) => {
      if (!(e instanceof SecretsError && e.code === "secrets.key_mismatch")) this.keyChecked = null;
      throw e;
    });
    return this.keyChecked;
  }

  private async readKeyCheck(): Promise<void> {
    const key = this.o.prefix + "keycheck";
    const stored = await this.run("key check", async () => {
      await this.client.send("SET", [key, this.cipher.seal(KEYCHECK_ID, KEYCHECK_TEXT).toString("base64"), "NX"]);
      return this.client.get(key);
    });
    let text: string | null = null;
    try {
      text = stored === null ? null : this.cipher.open(KEYCHECK_ID, Buffer.from(stored, "base64"));
    } catch {
      text = null;
    }
    if (text !== KEYCHECK_TEXT) {
      throw new SecretsError("secrets.key_mismatch", `the secrets in Redis ${this.url} (prefix ${this.o.prefix}) were sealed with another key than [secrets] key_path holds: give every gateway the same key`, { url: this.url, prefix: this.o.prefix });
    }
  }

  /** Run `fn` against Redis, connecting first; Redis failures become store_failed. */
  private async run<T>(what: string, fn: () => Promise<T>): Promise<T> {
    try {
      // calls are not queued while disconnected: an API call fails fast instead
      if (!this.client.connected) await this.client.connect();
      return await fn();
    } catch (e) {
      if (e instanceof SecretsError) throw e;
      throw new SecretsError("secrets.store_failed", `secrets store in Redis ${this.url}: ${what} failed: ${errorMessage(e)}`, { url: this.url }, { cause: e });
    }
  }

  private async call<T>(what: string, fn: () => Promise<T>): Promise<T> {
    await this.checkKey();
    return this.run(what, fn);
  }

  private eval(script: string, args: (string | number)[]): Promise<unknown> {
    return this.client.send("EVAL", [script, "0", this.o.prefix, ...args.map(String)]);
  }

  /** Create secret `name` (version 1). @throws SecretsError bad_request, conflict, store_failed, key_mismatch */
  async create(name: string, value: unknown, metadata: unknown = {}): Promise<SecretInfo> {
    const n = normalizeName(name);
    const v = checkValue(value);
    const m = checkMetadata(metadata ?? {});
    const id = newSecretId();
    const t = this.now();
    const sealed = this.cipher.seal(id, v).toString("base64");
    const r = await this.call("create", () => this.eval(CREATE, [id, n, sealed, JSON.stringify(m), t, this.o.maxSecrets, orderMember(t, id)]));
    if (r === 1) throw new SecretsError("secrets.conflict", `a secret named ${JSON.stringify(n)} exists`, { name: n });
    if (r === 2) throw new SecretsError("secrets.conflict", `the cluster holds its limit of ${this.o.maxSecrets} secrets ([secrets] max_secrets)`, { limit: this.o.maxSecrets });
    if (r !== 0) throw new SecretsError("secrets.store_failed", `secrets store in Redis ${this.url}: create answered ${JSON.stringify(r)}`, { url: this.url });
    return { secretID: id, name: n, currentVersion: 1, metadata: m, createdAt: t, updatedAt: t };
  }

  /**
   * Give secret `selector` a new value as its next version; metadata replaces the stored one
   * when given (even `{}`), and is kept when undefined or null.
   * @throws SecretsError bad_request, not_found, store_failed, key_mismatch
   */
  async update(selector: string, value: unknown, metadata?: unknown): Promise<SecretInfo> {
    const ref = parseSelector(selector);
    const v = checkValue(value);
    const m = metadata === undefined || metadata === null ? undefined : checkMetadata(metadata);
    const id = await this.idOf(ref);
    if (!id) throw notFound(selector);
    // sealed for this id: if the name now belongs to a new secret, the script finds the old id gone
    const sealed = this.cipher.seal(id, v).toString("base64");
    const r = await this.call("update", () => this.eval(UPDATE, [id, sealed, this.now(), m ? "1" : "0", m ? JSON.stringify(m) : ""]));
    if (r === null) throw notFound(selector);
    return this.info(id, r);
  }

  /** @throws SecretsError bad_request, not_found, store_failed, key_mismatch */
  async get(selector: string): Promise<SecretInfo> {
    const ref = parseSelector(selector);
    const id = await this.idOf(ref);
    const r = id ? await this.fields(id) : null;
    if (!id || !r) throw notFound(selector);
    return this.info(id, r);
  }

  /**
   * Remove secret `selector` and its value.
   * @returns false when there was none
   * @throws SecretsError bad_request, store_failed, key_mismatch
   */
  async destroy(selector: string): Promise<boolean> {
    const id = await this.idOf(parseSelector(selector));
    if (!id) return false;
    return (await this.call("destroy", () => this.eval(DESTROY, [id]))) === 1;
  }

  /** One page of secrets, oldest first (then by id), `limit` 1..100. @throws SecretsError bad_request, store_failed, key_mismatch */
  async list(limit = 100, nextToken?: string): Promise<SecretPage> {
    checkLimit(limit);
    const after = nextToken === undefined ? undefined : decodePageToken(nextToken);
    const members = (await this.call("list", () => this.client.send("ZRANGEBYLEX", [this.o.prefix + "order", after ? `(${orderMember(after.t, after.id)}` : "-", "+", "LIMIT", "0", String(limit + 1)]))) as string[];
    const ids = members.map((mem) => mem.slice(mem.indexOf(".") + 1));
    const rows = await Promise.all(ids.slice(0, limit).map((id) => this.fields(id)));
    // a secret destroyed between the two reads is left out
    const items = rows.flatMap((r, i) => (r ? [this.info(ids[i]!, r)] : []));
    const last = items.at(-1);
    return ids.length > limit && last ? { items, nextToken: encodePageToken(last) } : { items };
  }

  /** The current value of secret `name` (any case), or null. @throws SecretsError sealed_corrupt, store_failed, key_mismatch */
  async resolve(name: string): Promise<string | null> {
    let n: string;
    try {
      n = normalizeName(name);
    } catch {
      return null;
    }
    const id = await this.idOf({ name: n });
    if (!id) return null;
    const sealed = (await this.call("resolve", () => this.client.hget(this.o.prefix + "s:" + id, "sealed"))) as string | null;
    return sealed === null ? null : this.cipher.open(id, Buffer.from(sealed, "base64"));
  }

  /** Close the connection. */
  close(): void {
    this.client.close();
  }

  private async idOf(ref: { id: string } | { name: string }): Promise<string | null> {
    if ("id" in ref) return ref.id;
    return (await this.call("lookup", () => this.client.hget(this.o.prefix + "names", ref.name))) as string | null;
  }

  /** INFO_FIELDS of secret `id`, or null when it has none. */
  private async fields(id: string): Promise<unknown[] | null> {
    const r = (await this.call("read", () => this.client.send("HMGET", [this.o.prefix + "s:" + id, ...INFO_FIELDS]))) as unknown[];
    return r[0] === null || r[0] === undefined ? null : r;
  }

  /** A record's info from its INFO_FIELDS. @throws SecretsError store_failed for one this code cannot read */
  private info(id: string, r: unknown): SecretInfo {
    const [name, version, metadata, created, updated] = Array.isArray(r) ? r : [];
    let meta: unknown;
    try {
      meta = JSON.parse(String(metadata));
    } catch {
      meta = null;
    }
    const num = (x: unknown) => (typeof x === "string" && /^[0-9]{1,16}$/.test(x) ? Number(x) : typeof x === "number" && Number.isSafeInteger(x) ? x : NaN);
    const info = { secretID: id, name: String(name), currentVersion: num(version), metadata: meta as Record<string, string>, createdAt: num(created), updatedAt: num(updated) };
    const metaOk = typeof meta === "object" && meta !== null && !Array.isArray(meta) && Object.values(meta).every((x) => typeof x === "string");
    if (typeof name !== "string" || !metaOk || [info.currentVersion, info.createdAt, info.updatedAt].some(Number.isNaN)) {
      throw new SecretsError("secrets.store_failed", `secrets store in Redis ${this.url}: the record of ${id} is not one this version reads`, { url: this.url, secret: id });
    }
    return info;
  }
}
