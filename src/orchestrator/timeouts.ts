/**
 * Default sandbox lifetimes: the API's, and the ones the node's own clients (the CLI, the
 * console) ask for. Plain constants, no imports: the console's browser bundle reads this file too.
 */

/** Lifetime of fork children when the request names none, seconds (E2B's default). */
export const FORK_DEFAULT_TIMEOUT_SECS = 15;

/**
 * Lifetime of a sandbox a create gets when it names none, seconds: what the E2B SDKs send
 * (`timeoutMs` 300 000) and the default of `[orchestrator] default_timeout_secs`. The CLI and the
 * console ask it for fork children as well, whose API default is E2B's 15 s
 * (FORK_DEFAULT_TIMEOUT_SECS): a child forked from a shell or a button lives as long as a sandbox
 * created there.
 */
export const CREATE_DEFAULT_TIMEOUT_SECS = 300;
