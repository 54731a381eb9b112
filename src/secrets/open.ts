/**
 * The secrets of a node from its config: `[secrets] gateway_url` set → the gateway's store
 * (RemoteSecretSource; this node keeps none); else this node's store in its database, sealed with
 * the key of `[secrets] key_path` (default `$home_path/secrets.key`).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Config } from "../config/index.ts";
import type { Db } from "../db/index.ts";
import { SecretCipher } from "./cipher.ts";
import { RemoteSecretSource } from "./remote.ts";
import { SecretStore, type SecretSource } from "./store.ts";

/** A node's secrets: where values come from, and the local store when it keeps one. */
export type NodeSecrets = { source: SecretSource; store: SecretStore; remoteUrl?: undefined } | { source: SecretSource; store?: undefined; remoteUrl: string };

/** The secrets key file of a config. */
export function secretsKeyPath(cfg: Config): string {
  return cfg.secrets.key_path || join(cfg.home_path, "secrets.key");
}

/**
 * Open the node's secrets.
 * @throws SecretsError `secrets.key_unusable` (the key file cannot be made, read or trusted)
 */
export function openSecrets(cfg: Config, db: Db): NodeSecrets {
  const s = cfg.secrets;
  if (s.gateway_url) {
    // the node's API key: the one the gateway sends nodes (config, else the node's key file, src/api/auth.ts)
    const key = () => cfg.api.key || readFileSync(join(cfg.home_path, "api-key"), "utf8").trim();
    return { source: new RemoteSecretSource(s.gateway_url, key, s.resolve_timeout_ms), remoteUrl: s.gateway_url };
  }
  const store = new SecretStore(db, SecretCipher.fromKeyFile(secretsKeyPath(cfg)), s.max_secrets);
  return { source: store, store };
}
