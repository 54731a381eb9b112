/**
 * Registry credentials: the operator's Docker `config.json` (`[image] auth_file`), the
 * credentials a build request brings, the containers-auth.json file skopeo reads, and the
 * redaction that keeps every secret out of logs, build logs and error messages.
 *
 * Docker's config.json (docker-cli `configfile`): `{"auths": {"<key>": {"auth": base64(user:pass)
 * | "username"+"password", "identitytoken"?}}}`; keys are a registry host (`registry.example`,
 * `127.0.0.1:5000`), often with a scheme and a path (`https://index.docker.io/v1/` is Docker
 * Hub). `credsStore` / `credHelpers` name helper programs this node does not run (ignored, said
 * once in the log). containers-auth.json(5), what skopeo's `--authfile` reads: `{"auths":
 * {"<host[/namespace]>": {"auth": base64(user:pass), "identitytoken"?}}}`; an identity token is
 * sent to the registry's token server as an OAuth2 refresh token.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { errorMessage } from "../util/error.ts";
import { ImageError } from "./errors.ts";
import { canonicalRegistry } from "./reference.ts";

/** Credentials for one registry: username + password, and/or an OAuth2 identity (refresh) token. */
export interface RegistryAuth {
  username: string;
  password: string;
  /** Docker's `identitytoken`: exchanged at the token server for access tokens. */
  identityToken?: string;
}

/** Credentials per key: a registry host, or host/namespace (the longest match wins). */
export type AuthEntries = Record<string, RegistryAuth>;

/**
 * The registry key Docker's `key` names: scheme, Docker Hub's `/v1/` path and trailing slashes
 * dropped, Docker Hub's aliases as `docker.io`, the host lower-cased.
 * @example normalizeAuthKey("https://index.docker.io/v1/") === "docker.io"
 */
export function normalizeAuthKey(key: string): string {
  let k = key.trim().replace(/^[a-z][a-z0-9+.-]*:\/\//i, "").replace(/\/+$/, "");
  const slash = k.indexOf("/");
  let host = slash < 0 ? k : k.slice(0, slash);
  let path = slash < 0 ? "" : k.slice(slash);
  host = canonicalRegistry(host.toLowerCase());
  if (path === "/v1" || path === "/v2") path = "";
  k = host + path;
  return k;
}

/**
 * Read a Docker config.json. Entries without usable credentials are left out.
 * @throws ImageError `image.bad_config` when the file cannot be read or is not such a document
 *   (the message never quotes the file's content)
 */
export function readAuthFile(path: string): { entries: AuthEntries; helpers: string[] } {
  const fail = (why: string): never => {
    throw new ImageError("image.bad_config", `[image] auth_file ${path}: ${why}`, { key: "image.auth_file", path });
  };
  let doc: unknown;
  try {
    doc = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    // a JSON parse error quotes the text near the fault: only say which kind of fault
    fail(e instanceof SyntaxError ? "not valid JSON" : errorMessage(e));
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) fail("not a JSON object");
  const d = doc as { auths?: unknown; credsStore?: unknown; credHelpers?: unknown };
  const helpers = [...(typeof d.credsStore === "string" && d.credsStore ? ["credsStore"] : []), ...(d.credHelpers && typeof d.credHelpers === "object" ? ["credHelpers"] : [])];
  const entries: AuthEntries = {};
  if (d.auths === undefined) return { entries, helpers };
  if (typeof d.auths !== "object" || d.auths === null || Array.isArray(d.auths)) fail(`"auths" is not an object`);
  for (const [key, raw] of Object.entries(d.auths as Record<string, unknown>)) {
    if (typeof raw !== "object" || raw === null) fail(`auths entry ${JSON.stringify(key)} is not an object`);
    const e = raw as { auth?: unknown; username?: unknown; password?: unknown; identitytoken?: unknown };
    let username = typeof e.username === "string" ? e.username : "";
    let password = typeof e.password === "string" ? e.password : "";
    if (typeof e.auth === "string" && e.auth) {
      const plain = Buffer.from(e.auth, "base64").toString("utf8");
      const i = plain.indexOf(":");
      if (i < 0) fail(`auths entry ${JSON.stringify(key)}: "auth" is not base64 of user:password`);
      username = plain.slice(0, i);
      password = plain.slice(i + 1);
    }
    const identityToken = typeof e.identitytoken === "string" && e.identitytoken ? e.identitytoken : undefined;
    if (!username && !password && !identityToken) continue;
    entries[normalizeAuthKey(key)] = { username, password, ...(identityToken ? { identityToken } : {}) };
  }
  return { entries, helpers };
}

/**
 * The entry for `repository` on `host` (keys `host/a/b` before `host/a` before `host`).
 * @returns the credentials, or undefined when no key matches
 */
export function authFor(entries: AuthEntries, host: string, repository = ""): RegistryAuth | undefined {
  const h = canonicalRegistry(host.toLowerCase());
  const segs = repository.split("/").filter(Boolean);
  for (let i = segs.length; i >= 0; i--) {
    const k = i === 0 ? h : `${h}/${segs.slice(0, i).join("/")}`;
    if (entries[k]) return entries[k];
  }
  return undefined;
}

/**
 * Write `entries` as a containers-auth.json file (mode 0600) at `path`, the file skopeo's
 * `--authfile` reads. An identity token goes with the username Docker stores beside it.
 */
export function writeContainersAuth(path: string, entries: AuthEntries): void {
  const auths: Record<string, { auth: string; identitytoken?: string }> = {};
  for (const [k, a] of Object.entries(entries)) {
    auths[k] = { auth: Buffer.from(`${a.username}:${a.password}`).toString("base64"), ...(a.identityToken ? { identitytoken: a.identityToken } : {}) };
  }
  writeFileSync(path, JSON.stringify({ auths }), { mode: 0o600 });
}

/**
 * Every form in which the secrets of `entries` could show in a line of text: passwords, identity
 * tokens, and the base64 `user:password` Basic header value.
 */
export function secretsOf(entries: Iterable<RegistryAuth>): string[] {
  const out: string[] = [];
  for (const a of entries) {
    if (a.password) out.push(a.password, Buffer.from(`${a.username}:${a.password}`).toString("base64"));
    if (a.identityToken) out.push(a.identityToken);
  }
  // longest first: a secret holding another is replaced whole
  return [...new Set(out.filter((s) => s.length >= 1))].sort((a, b) => b.length - a.length);
}

/** `text` with every one of `secrets` replaced by `***`. */
export function redact(text: string, secrets: readonly string[]): string {
  let t = text;
  for (const s of secrets) if (t.includes(s)) t = t.split(s).join("***");
  return t;
}
