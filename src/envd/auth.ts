/**
 * Request authentication as E2B's envd does it (docs/e2b-contract.md §3.1): `X-Access-Token`
 * once /init set a token; the acting user from `Authorization: Basic base64(user:)` on RPCs.
 */
import { tokensEqual } from "./signature.ts";
import { EnvdError } from "./errors.ts";
import type { EnvdState } from "./state.ts";
import { lookupUser, type UserInfo } from "./users.ts";

export { tokensEqual } from "./signature.ts";

/** True when the request carries the current access token, or none is set. */
export function hasValidToken(state: EnvdState, headers: Headers): boolean {
  if (!state.accessToken) return true;
  const got = headers.get("x-access-token");
  return got !== null && tokensEqual(got, state.accessToken);
}

/**
 * The username in a Basic `Authorization` header (password ignored), or undefined.
 * @throws EnvdError `unauthenticated` for a malformed header.
 */
export function basicAuthUser(header: string | null): string | undefined {
  if (!header) return undefined;
  const m = /^Basic\s+([A-Za-z0-9+/=_-]+)\s*$/i.exec(header);
  if (!m) throw new EnvdError("unauthenticated", "malformed Authorization header", {});
  const decoded = Buffer.from(m[1]!, "base64").toString("utf8");
  const colon = decoded.indexOf(":");
  const name = colon === -1 ? decoded : decoded.slice(0, colon);
  return name || undefined;
}

/**
 * The user an RPC acts as: Basic-auth user, else the default user from /init.
 * @throws EnvdError `unauthenticated` for an unknown user or a malformed header.
 */
export function rpcUser(state: EnvdState, headers: Headers): UserInfo {
  return lookupUser(basicAuthUser(headers.get("authorization")) ?? state.defaultUser);
}
