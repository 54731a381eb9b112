/**
 * E2B's webhook signature (../shared/docs/e2b-lifecycle-events.md §6, from E2B's docs and their
 * verification code): SHA-256 over the UTF-8 bytes of `secret + rawBody` (a plain concatenation,
 * not an HMAC), base64url without padding, sent as header `e2b-signature` with
 * `e2b-signature-version: v1`. Receivers verify it over the raw body bytes. (Upstream AgentENV
 * sends the standard base64 alphabet instead; E2B's docs and verification code are followed here:
 * the two differ whenever the digest encodes a `+` or `/`.)
 */
import { createHash, timingSafeEqual } from "node:crypto";

/** Header names of a delivery. */
export const SIGNATURE_HEADER = "e2b-signature";
export const SIGNATURE_VERSION_HEADER = "e2b-signature-version";
export const WEBHOOK_ID_HEADER = "e2b-webhook-id";
export const DELIVERY_ID_HEADER = "e2b-delivery-id";
/** The one signature version. */
export const SIGNATURE_VERSION = "v1";

/** The `e2b-signature` of `body` (the exact bytes sent) under `secret`. */
export function webhookSignature(secret: string, body: string | Uint8Array): string {
  return createHash("sha256").update(secret).update(body).digest("base64url");
}

/** Whether `signature` is `body`'s under `secret` (constant time). */
export function verifyWebhookSignature(secret: string, body: string | Uint8Array, signature: string): boolean {
  const want = Buffer.from(webhookSignature(secret, body));
  const got = Buffer.from(signature);
  return want.length === got.length && timingSafeEqual(want, got);
}
