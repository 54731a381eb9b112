/**
 * The cluster's secrets store as a node sees it: the gateway keeps the one store (its own
 * database and key) and serves a secret's current value to nodes at `POST
 * /internal/secrets/resolve` `{name}` (authenticated with the node API key the gateway sends nodes:
 * `[gateway] node_api_key`), answering `{value}` or 404. A node asks once per intercepted request,
 * so a `Secret.update` applies to the next one. The value crosses the cluster network: run it on a
 * trusted network or behind TLS, as the rest of the node traffic.
 */
import { errorMessage } from "../util/error.ts";
import { SecretsError } from "./errors.ts";
import type { SecretSource } from "./store.ts";

/** Path of the gateway's resolve endpoint. */
export const RESOLVE_PATH = "/internal/secrets/resolve";

/** Asks the gateway at `url` for values, with key `key()`. */
export class RemoteSecretSource implements SecretSource {
  constructor(
    readonly url: string,
    private readonly key: () => string,
    private readonly timeoutMs: number,
  ) {}

  /** @throws SecretsError `secrets.remote_failed` when the gateway does not answer 200 or 404 */
  async resolve(name: string): Promise<string | null> {
    let res: Response;
    try {
      res = await fetch(`${this.url.replace(/\/+$/, "")}${RESOLVE_PATH}`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-api-key": this.key() },
        body: JSON.stringify({ name }),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e) {
      throw new SecretsError("secrets.remote_failed", `the gateway's secrets store at ${this.url} did not answer: ${errorMessage(e)}`, { url: this.url }, { cause: e });
    }
    if (res.status === 404) {
      await res.body?.cancel();
      return null;
    }
    if (res.status !== 200) {
      await res.body?.cancel();
      throw new SecretsError("secrets.remote_failed", `the gateway's secrets store at ${this.url} answered ${res.status}`, { url: this.url, status: res.status });
    }
    const body = (await res.json().catch(() => null)) as { value?: unknown } | null;
    if (typeof body?.value !== "string") throw new SecretsError("secrets.remote_failed", `the gateway's secrets store at ${this.url} answered without a value`, { url: this.url, status: 200 });
    return body.value;
  }
}
