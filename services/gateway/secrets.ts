/**
 * The cluster's one secrets store, kept by the gateway: with `[secrets] store = "redis"` in Redis,
 * shared by every gateway replica (RedisSecretStore: records sealed with the key of `[secrets]
 * key_path`, which must exist, the same file on every replica); else its own SQLite file
 * (`$home_path/gateway-secrets.db`, the secrets table only) sealed with that key (made on first
 * start). Clients manage secrets through the gateway's `/secrets` (the node API's routes, served
 * here, never forwarded); nodes configured with `[secrets] gateway_url` ask
 * `POST /internal/secrets/resolve` `{name}` for a value at each intercepted request, with the node
 * API key this gateway sends them (`[gateway] node_api_key`, else its client key). docs/security.md.
 */
import { join } from "node:path";
import { keyMatches } from "../../src/api/auth.ts";
import { secretRoutes } from "../../src/api/routes/secrets.ts";
import { toErrorResponse } from "../../src/api/status.ts";
import { openDb, SECRETS_MIGRATIONS, type Db } from "../../src/db/index.ts";
import { RedisSecretStore, SecretCipher, SecretStore, type SecretKeeper } from "../../src/secrets/index.ts";

/** Where the gateway's secrets live (from GatewayConfig). */
export interface GatewaySecretsOptions {
  /** Data directory (the file store's database). */
  homePath: string;
  /** `[secrets] key_path` resolved. */
  keyPath: string;
  maxSecrets: number;
  /** The key nodes present to the resolve path. */
  nodeKey: string;
  /** Redis of `[secrets] store = "redis"`; absent: the file store. */
  redis?: { url: string; prefix: string; connectTimeoutMs: number };
}

/** The gateway's store and the handlers that serve it. */
export class GatewaySecrets {
  private readonly db: Db | null = null;
  private readonly redis: RedisSecretStore | null = null;
  readonly store: SecretKeeper;
  /** "file" or "redis" (for logs and /health). */
  readonly kind: "file" | "redis";
  private readonly app: { handle(req: Request): Promise<Response> };
  private readonly nodeKey: string;

  /**
   * Opens the file store at once; the Redis store connects at its first call.
   * @throws SecretsError `secrets.key_unusable` (for Redis also when the key file is missing);
   *   DbError when the file cannot be opened
   */
  constructor(o: GatewaySecretsOptions) {
    this.nodeKey = o.nodeKey;
    if (o.redis) {
      // never a key of our own: the other replicas could not open what we seal
      const cipher = SecretCipher.fromKeyFile(o.keyPath, false);
      this.redis = new RedisSecretStore({ ...o.redis, maxSecrets: o.maxSecrets }, cipher);
      this.store = this.redis;
      this.kind = "redis";
    } else {
      const cipher = SecretCipher.fromKeyFile(o.keyPath);
      this.db = openDb(join(o.homePath, "gateway-secrets.db"), SECRETS_MIGRATIONS);
      this.store = new SecretStore(this.db, cipher, o.maxSecrets);
      this.kind = "file";
    }
    this.app = secretRoutes({ store: this.store });
  }

  /**
   * Check the store can be used: Redis answers and this gateway's key opens its records. The
   * file store has nothing to check.
   * @throws SecretsError store_failed (Redis unreachable), key_mismatch (another key sealed them)
   */
  async check(): Promise<void> {
    await this.redis?.checkKey();
  }

  /** A `/secrets` request (the client key already checked). */
  handle(req: Request): Promise<Response> {
    return this.app.handle(req);
  }

  /** A node's `POST /internal/secrets/resolve` `{name}`: 200 `{value}`, 404, 401 (not the node key), 400; 503/500 when the store fails. */
  async resolve(req: Request): Promise<Response> {
    const noStore = { "cache-control": "no-store" };
    if (req.method !== "POST") return Response.json({ code: 405, message: "POST only" }, { status: 405, headers: noStore });
    if (!keyMatches(req.headers.get("x-api-key"), this.nodeKey)) return Response.json({ code: 401, message: "the node API key is required" }, { status: 401, headers: noStore });
    const body = (await req.json().catch(() => null)) as { name?: unknown } | null;
    if (typeof body?.name !== "string") return Response.json({ code: 400, message: "body must be {name}" }, { status: 400, headers: noStore });
    let value: string | null;
    try {
      value = await this.store.resolve(body.name);
    } catch (e) {
      const r = toErrorResponse(e);
      r.headers.set("cache-control", "no-store");
      return r;
    }
    if (value === null) return Response.json({ code: 404, message: "Secret not found" }, { status: 404, headers: noStore });
    return Response.json({ value }, { headers: noStore });
  }

  close(): void {
    this.db?.close();
    this.redis?.close();
  }
}
