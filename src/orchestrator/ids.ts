/**
 * Identifiers and secrets. Sandbox ids are 20 lowercase alphanumerics (E2B's shape; the proxy's
 * host parser splits `{port}-{id}` on `-`, so ids never contain `-` or `.`).
 */
const ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789";

/** Pattern every sandbox id matches. */
export const SANDBOX_ID_RE = /^[a-z0-9]{1,64}$/;

/** A new random sandbox id, 20 chars of [a-z0-9]. */
export function newSandboxId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(20));
  let s = "";
  // 256 % 36 bias is irrelevant for ids (uniqueness, not secrecy)
  for (const b of bytes) s += ALNUM[b % ALNUM.length];
  return s;
}

/** `n` random bytes as lowercase hex (envd access tokens use 32 bytes = 64 hex chars, like E2B). */
export function randomHex(n: number): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(n))).toString("hex");
}
