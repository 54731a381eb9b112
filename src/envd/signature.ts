/**
 * Signed file URLs (E2B `Sandbox.uploadUrl` / `downloadUrl`): `v1_` + base64 without padding of
 * SHA-256 over `path:operation:user:accessToken[:expiration]` (e2b SDK src/sandbox/signature.ts;
 * ../shared/docs/e2b-contract.md §3.4). envd checks them; the node's proxy uses the same
 * function to find which sandbox's token produced one.
 */
import { createHash, timingSafeEqual } from "node:crypto";

/** What E2B's envd answers (401) for a signed URL past its `signature_expiration`. */
export const SIGNATURE_EXPIRED = "signature is already expired";

/** The signature of a /files request (`op` read = GET, write = POST); `expiration` in unix seconds. */
export function fileSignature(path: string, op: "read" | "write", user: string, token: string, expiration?: number): string {
  const raw = expiration === undefined ? `${path}:${op}:${user}:${token}` : `${path}:${op}:${user}:${token}:${expiration}`;
  return `v1_${createHash("sha256").update(raw).digest("base64").replace(/=+$/, "")}`;
}

/** Constant-time string comparison. */
export function tokensEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}
