/**
 * Customer secrets (issue 28): values kept encrypted in the node database (key outside it,
 * `[secrets] key_path`), referenced from egress rules as `${e2b.secrets.NAME}` and resolved on the
 * host when a request leaves a sandbox (src/net/egress); never sent into a sandbox, never in an
 * API answer, error or log line. In a cluster the gateway keeps the one store and nodes ask it
 * for a value per request (RemoteSecretSource); its replicas share it in Redis when
 * `[secrets] store = "redis"` (RedisSecretStore). docs/security.md.
 */
export { SecretCipher } from "./cipher.ts";
export { SECRETS_ERRORS, SecretsError, type SecretsErrorCode } from "./errors.ts";
export { isSecretId, newSecretId, normalizeName, parseSelector, typeIdSuffix, NAME_MAX, type SecretRef } from "./names.ts";
export { checkMetadata, checkValue, SecretStore, VALUE_MAX_BYTES, type SecretInfo, type SecretKeeper, type SecretPage, type SecretSource } from "./store.ts";
export { RedisSecretStore, type RedisSecretsOptions } from "./redis-store.ts";
export { openSecrets, secretsKeyPath, type NodeSecrets } from "./open.ts";
export { RemoteSecretSource, RESOLVE_PATH } from "./remote.ts";
