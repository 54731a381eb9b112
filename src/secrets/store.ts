/**
 * The node's secrets store (table `secrets`, src/db/schema/secrets.ts): create, update (a new
 * version), get, list (oldest first, paginated), destroy, and `resolve` for the egress proxy.
 * Values are sealed with a SecretCipher before they reach the database and are returned by
 * `resolve` only; no other method, error or log line carries one. Limits are E2B's
 * (../shared/docs/e2b-egress-secrets.md §1.1): value ≤ 64 KiB, metadata ≤ 32 entries (key ≤ 128
 * bytes, value ≤ 1024 bytes, ≤ 8192 bytes in all).
 */
import { and, asc, eq, gt, or } from "drizzle-orm";
import type { Db } from "../db/index.ts";
import { secrets } from "../db/schema/secrets.ts";
import type { SecretCipher } from "./cipher.ts";
import { SecretsError } from "./errors.ts";
import { newSecretId, normalizeName, parseSelector, type SecretRef } from "./names.ts";

/** Largest value, bytes (UTF-8). */
export const VALUE_MAX_BYTES = 65_536;
const META_ENTRIES = 32;
const META_KEY_BYTES = 128;
const META_VALUE_BYTES = 1024;
const META_TOTAL_BYTES = 8192;

/** What the API shows of a secret (E2B `Secret`): never its value. Times in unix ms. */
export interface SecretInfo {
  secretID: string;
  name: string;
  currentVersion: number;
  metadata: Record<string, string>;
  createdAt: number;
  updatedAt: number;
}

/** Something that gives a secret's current value by name (the store, or the gateway's over HTTP). */
export interface SecretSource {
  /**
   * The current value of the secret named `name` (canonicalised), or null when none has it.
   * @throws SecretsError when the store cannot answer
   */
  resolve(name: string): Promise<string | null>;
}

const bytes = (s: string) => Buffer.byteLength(s, "utf8");

/**
 * A secret value as given: a string of 1..VALUE_MAX_BYTES bytes.
 * @throws SecretsError `secrets.bad_request` (field `value`; the value itself is never quoted)
 */
export function checkValue(v: unknown): string {
  if (typeof v !== "string") throw new SecretsError("secrets.bad_request", "value must be a string", { field: "value" });
  if (v.length === 0 || bytes(v) > VALUE_MAX_BYTES) throw new SecretsError("secrets.bad_request", `value must be 1..${VALUE_MAX_BYTES} bytes`, { field: "value" });
  return v;
}

/**
 * Metadata as given: a map of strings within E2B's limits.
 * @throws SecretsError `secrets.bad_request` (field `metadata`)
 */
export function checkMetadata(m: unknown): Record<string, string> {
  const bad = (why: string) => new SecretsError("secrets.bad_request", `metadata ${why}`, { field: "metadata" });
  if (typeof m !== "object" || m === null || Array.isArray(m)) throw bad("must be an object of strings");
  const entries = Object.entries(m);
  if (entries.length > META_ENTRIES) throw bad(`may have at most ${META_ENTRIES} entries`);
  let total = 0;
  for (const [k, v] of entries) {
    if (typeof v !== "string") throw bad(`value of key ${JSON.stringify(k.slice(0, 64))} must be a string`);
    if (k.length === 0 || bytes(k) > META_KEY_BYTES) throw bad(`keys must be 1..${META_KEY_BYTES} bytes`);
    if (bytes(v) > META_VALUE_BYTES) throw bad(`values must be at most ${META_VALUE_BYTES} bytes`);
    total += bytes(k) + bytes(v);
  }
  if (total > META_TOTAL_BYTES) throw bad(`may hold at most ${META_TOTAL_BYTES} bytes in all`);
  return Object.fromEntries(entries) as Record<string, string>;
}

type Row = typeof secrets.$inferSelect;
const info = (r: Row): SecretInfo => ({ secretID: r.id, name: r.name, currentVersion: r.version, metadata: r.metadata, createdAt: r.createdAt, updatedAt: r.updatedAt });

/** One page of a listing: its secrets and the token of the next page (absent on the last). */
export interface SecretPage {
  items: SecretInfo[];
  nextToken?: string;
}

/**
 * What `/secrets` manages (src/api/routes/secrets.ts): the node's SecretStore (SQLite, answers at
 * once) or the gateway's RedisSecretStore (shared by its replicas, answers later). Methods throw
 * (or reject with) SecretsError as SecretStore documents.
 */
export interface SecretKeeper extends SecretSource {
  create(name: string, value: unknown, metadata?: unknown): SecretInfo | Promise<SecretInfo>;
  update(selector: string, value: unknown, metadata?: unknown): SecretInfo | Promise<SecretInfo>;
  get(selector: string): SecretInfo | Promise<SecretInfo>;
  destroy(selector: string): boolean | Promise<boolean>;
  list(limit?: number, nextToken?: string): SecretPage | Promise<SecretPage>;
}

/** Where a listing goes on: after the secret created at `t` (unix ms) with id `id`. */
export interface PagePosition {
  t: number;
  id: string;
}

/** The `nextToken` of a page that ended at `last`. */
export function encodePageToken(last: SecretInfo): string {
  return Buffer.from(`${last.createdAt}.${last.secretID}`).toString("base64url");
}

/**
 * Where a `nextToken` says to go on.
 * @throws SecretsError bad_request (field nextToken) for a token no store handed out
 */
export function decodePageToken(token: string): PagePosition {
  const m = /^([0-9]{1,16})\.(sec_[0-9a-z]{26})$/.exec(Buffer.from(token, "base64url").toString());
  if (!m) throw new SecretsError("secrets.bad_request", "nextToken is not a token this node handed out", { field: "nextToken" });
  return { t: Number(m[1]), id: m[2]! };
}

/**
 * A listing's `limit`: an integer in 1..100.
 * @throws SecretsError bad_request (field limit)
 */
export function checkLimit(limit: number): number {
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw new SecretsError("secrets.bad_request", "limit must be an integer in 1..100", { field: "limit" });
  return limit;
}

/** Secrets in the node database, sealed by `cipher`; at most `maxSecrets` of them. */
export class SecretStore implements SecretKeeper {
  constructor(
    private readonly db: Db,
    private readonly cipher: SecretCipher,
    private readonly maxSecrets: number,
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * Create secret `name` (version 1).
   * @throws SecretsError bad_request (name, value, metadata), conflict (name taken; store full)
   */
  create(name: string, value: unknown, metadata: unknown = {}): SecretInfo {
    const n = normalizeName(name);
    const v = checkValue(value);
    const m = checkMetadata(metadata ?? {});
    return this.db.sqlite.transaction(() => {
      if (this.row({ name: n })) throw new SecretsError("secrets.conflict", `a secret named ${JSON.stringify(n)} exists`, { name: n });
      const count = this.db.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM secrets").get()!.n;
      if (count >= this.maxSecrets) throw new SecretsError("secrets.conflict", `this node holds its limit of ${this.maxSecrets} secrets ([secrets] max_secrets)`, { limit: this.maxSecrets });
      const id = newSecretId();
      const t = this.now();
      const row: Row = { id, name: n, version: 1, sealed: this.cipher.seal(id, v), metadata: m, createdAt: t, updatedAt: t };
      this.db.orm.insert(secrets).values(row).run();
      return info(row);
    })();
  }

  /**
   * Give secret `selector` (id or name) a new value as its next version; metadata replaces the
   * stored one when given (even `{}`), and is kept when undefined.
   * @throws SecretsError bad_request, not_found
   */
  update(selector: string, value: unknown, metadata?: unknown): SecretInfo {
    const ref = parseSelector(selector);
    const v = checkValue(value);
    const m = metadata === undefined || metadata === null ? undefined : checkMetadata(metadata);
    return this.db.sqlite.transaction(() => {
      const r = this.row(ref);
      if (!r) throw notFound(selector);
      const next: Row = { ...r, version: r.version + 1, sealed: this.cipher.seal(r.id, v), metadata: m ?? r.metadata, updatedAt: this.now() };
      this.db.orm.update(secrets).set(next).where(eq(secrets.id, r.id)).run();
      return info(next);
    })();
  }

  /** @throws SecretsError bad_request (selector), not_found */
  get(selector: string): SecretInfo {
    const r = this.row(parseSelector(selector));
    if (!r) throw notFound(selector);
    return info(r);
  }

  /**
   * Remove secret `selector` and its value.
   * @returns false when there was none
   * @throws SecretsError bad_request (selector)
   */
  destroy(selector: string): boolean {
    const r = this.row(parseSelector(selector));
    if (!r) return false;
    this.db.orm.delete(secrets).where(eq(secrets.id, r.id)).run();
    return true;
  }

  /**
   * One page of secrets, oldest first (then by id), `limit` 1..100.
   * @throws SecretsError bad_request (limit, nextToken)
   */
  list(limit = 100, nextToken?: string): SecretPage {
    checkLimit(limit);
    const after = nextToken === undefined ? undefined : decodePageToken(nextToken);
    const rows = this.db.orm
      .select()
      .from(secrets)
      .where(after ? or(gt(secrets.createdAt, after.t), and(eq(secrets.createdAt, after.t), gt(secrets.id, after.id))) : undefined)
      .orderBy(asc(secrets.createdAt), asc(secrets.id))
      .limit(limit + 1)
      .all();
    const items = rows.slice(0, limit).map(info);
    const last = items.at(-1);
    return rows.length > limit && last ? { items, nextToken: encodePageToken(last) } : { items };
  }

  /** The current value of secret `name` (any case), or null. @throws SecretsError sealed_corrupt */
  async resolve(name: string): Promise<string | null> {
    let n: string;
    try {
      n = normalizeName(name);
    } catch {
      return null;
    }
    const r = this.row({ name: n });
    return r ? this.cipher.open(r.id, r.sealed) : null;
  }

  private row(ref: SecretRef): Row | undefined {
    return this.db.orm
      .select()
      .from(secrets)
      .where("id" in ref ? eq(secrets.id, ref.id) : eq(secrets.name, ref.name))
      .get();
  }
}

/** The error of a selector no secret answers to. */
export function notFound(selector: string): SecretsError {
  return new SecretsError("secrets.not_found", "Secret not found", { secret: selector.trim().slice(0, 128) });
}
