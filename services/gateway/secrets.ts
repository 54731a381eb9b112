/**
 * The cluster's one secrets store, kept by the gateway: its own SQLite file
 * (`$home_path/gateway-secrets.db`, the secrets table only) sealed with the key of `[secrets]
 * key_path`. Clients manage secrets through the gateway's `/secrets` (the node API's routes, served
 * here, never forwarded); nodes configured with `[secrets] gateway_url` ask
 * `POST /internal/secrets/resolve` `{name}` for a value at each intercepted request, with the node
 * API key this gateway sends them (`[gateway] node_api_key`, else its client key). docs/security.md.
 */
import { join } from "node:path";
import { keyMatches } from "../../src/api/auth.ts";
import { secretRoutes } from "../../src/api/routes/secrets.ts";
import { openDb, SECRETS_MIGRATIONS, type Db } from "../../src/db/index.ts";
import { SecretCipher, SecretStore } from "../../src/secrets/index.ts";

/** The gateway's store and the handlers that serve it. */
export class GatewaySecrets {
  private readonly db: Db;
  readonly store: SecretStore;
  private readonly app: { handle(req: Request): Promise<Response> };

  /** @throws SecretsError `secrets.key_unusable`; DbError when the file cannot be opened */
  constructor(homePath: string, keyPath: string, maxSecrets: number, private readonly nodeKey: string) {
    const cipher = SecretCipher.fromKeyFile(keyPath);
    this.db = openDb(join(homePath, "gateway-secrets.db"), SECRETS_MIGRATIONS);
    this.store = new SecretStore(this.db, cipher, maxSecrets);
    this.app = secretRoutes({ store: this.store });
  }

  /** A `/secrets` request (the client key already checked). */
  handle(req: Request): Promise<Response> {
    return this.app.handle(req);
  }

  /** A node's `POST /internal/secrets/resolve` `{name}`: 200 `{value}`, 404, 401 (not the node key), 400. */
  async resolve(req: Request): Promise<Response> {
    const noStore = { "cache-control": "no-store" };
    if (req.method !== "POST") return Response.json({ code: 405, message: "POST only" }, { status: 405, headers: noStore });
    if (!keyMatches(req.headers.get("x-api-key"), this.nodeKey)) return Response.json({ code: 401, message: "the node API key is required" }, { status: 401, headers: noStore });
    const body = (await req.json().catch(() => null)) as { name?: unknown } | null;
    if (typeof body?.name !== "string") return Response.json({ code: 400, message: "body must be {name}" }, { status: 400, headers: noStore });
    const value = await this.store.resolve(body.name);
    if (value === null) return Response.json({ code: 404, message: "Secret not found" }, { status: 404, headers: noStore });
    return Response.json({ value }, { headers: noStore });
  }

  close(): void {
    this.db.close();
  }
}
