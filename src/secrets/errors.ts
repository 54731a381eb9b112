import { AgentEnvError, type ErrorTable } from "../errors.ts";

/**
 * Secrets failures. Messages and details never carry a secret's value (they may name the secret
 * and the field at fault). Adding a code: see src/errors.ts.
 */
export const SECRETS_ERRORS = {
  "secrets.bad_request": "a malformed name, selector, value, metadata or page request (details.field)",
  "secrets.not_found": "no secret has that id or name (details.secret)",
  "secrets.conflict": "the name is taken, or the store holds [secrets] max_secrets already (details.name, limit)",
  "secrets.key_unusable": "the key file cannot be read, made or trusted (details.path)",
  "secrets.sealed_corrupt": "a stored value does not decrypt with the key (another key, or a damaged row) (details.secret)",
  "secrets.remote_failed": "the cluster's secrets store (the gateway) did not answer as expected (details.url, status)",
  "secrets.remote_store": "this node's secrets are kept by the cluster's gateway: manage them there (details.url)",
  "secrets.store_failed": "the shared secrets store (Redis) did not answer, or holds a record this code cannot read (details.url)",
  "secrets.key_mismatch": "the shared store's records were sealed with another key than this process's [secrets] key_path (details.url)",
} as const satisfies ErrorTable;
/** A SecretsError code. */
export type SecretsErrorCode = keyof typeof SECRETS_ERRORS;

/** A typed secrets failure (never carrying a value). */
export class SecretsError extends AgentEnvError<SecretsErrorCode> {}
