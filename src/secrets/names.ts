/**
 * Secret names and identifiers as E2B defines them (../shared/docs/e2b-egress-secrets.md §1.2):
 * a name is trimmed, 1..128 bytes of `A-Z a-z 0-9 _ -`, then lower-cased, and must not start with
 * `sec_`; an id is `sec_` + the 26-character TypeID suffix of a UUIDv7. A path selector is an id
 * when it starts with `sec_` (never a name then), else a name.
 */
import { SecretsError } from "./errors.ts";

/** Longest name, bytes. */
export const NAME_MAX = 128;
const NAME_RE = /^[A-Za-z0-9_-]{1,128}$/;
/** TypeID's base32 alphabet (Crockford, lower case). */
const ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz";
const ID_RE = /^sec_[0-7][0-9abcdefghjkmnpqrstvwxyz]{25}$/;

/**
 * The canonical form of a secret name.
 * @throws SecretsError `secrets.bad_request` (field `name`) naming the rule broken
 */
export function normalizeName(raw: string, field = "name"): string {
  const s = raw.trim();
  if (!NAME_RE.test(s)) throw new SecretsError("secrets.bad_request", `${field} must be 1..${NAME_MAX} characters of A-Z a-z 0-9 _ -`, { field });
  const n = s.toLowerCase();
  if (n.startsWith("sec_")) throw new SecretsError("secrets.bad_request", `${field} must not start with "sec_" (ids do)`, { field });
  return n;
}

/** True for a well-formed secret id. */
export function isSecretId(s: string): boolean {
  return ID_RE.test(s);
}

/** What a path selector names. */
export type SecretRef = { id: string } | { name: string };

/**
 * Classify a `/secrets/{secretID}` selector: trimmed and lower-cased; `sec_...` must be a valid
 * id, anything else is normalised as a name.
 * @throws SecretsError `secrets.bad_request` (field `secretID`)
 */
export function parseSelector(raw: string): SecretRef {
  const s = raw.trim().toLowerCase();
  if (s.startsWith("sec_")) {
    if (!isSecretId(s)) throw new SecretsError("secrets.bad_request", "secretID starts with sec_ but is not a valid secret id", { field: "secretID" });
    return { id: s };
  }
  return { name: normalizeName(s, "secretID") };
}

/** TypeID suffix of 16 bytes: 130 bits (two leading zero bits) as 26 base32 characters. */
export function typeIdSuffix(bytes: Uint8Array): string {
  if (bytes.length !== 16) throw new RangeError("a TypeID encodes 16 bytes");
  let n = 0n;
  for (const b of bytes) n = (n << 8n) | BigInt(b);
  let out = "";
  for (let i = 25; i >= 0; i--) out += ALPHABET[Number((n >> BigInt(i * 5)) & 31n)];
  return out;
}

/** A new secret id (`sec_` + TypeID of a fresh UUIDv7). */
export function newSecretId(): string {
  return `sec_${typeIdSuffix(Buffer.from(Bun.randomUUIDv7().replaceAll("-", ""), "hex"))}`;
}
