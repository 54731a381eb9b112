/**
 * User file metadata (envd ≥ 0.6.2, docs/e2b-contract.md §3.3): `X-Metadata-<key>: <value>` on
 * upload is stored as xattr `user.e2b.<lowercased key>`; each upload replaces the whole set;
 * EntryInfo.metadata lists them with the prefix stripped.
 */
import { getXattr, listXattrs, removeXattr, setXattr, XattrError } from "../ffi/xattr.ts";
import { EnvdError } from "./errors.ts";
import { errorMessage } from "../util/error.ts";

const PREFIX = "user.e2b.";
const HEADER_PREFIX = "x-metadata-";
// The SDK's own checks: HTTP token characters for keys, printable US-ASCII for values.
const KEY_RE = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/;
const VALUE_RE = /^[\x20-\x7e]*$/;

/**
 * Metadata carried by request headers (keys lowercased).
 * @throws EnvdError `invalid_argument` for a bad key or value.
 */
export function metadataFromHeaders(headers: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of headers) {
    if (!name.toLowerCase().startsWith(HEADER_PREFIX)) continue;
    const key = name.slice(HEADER_PREFIX.length).toLowerCase();
    if (!KEY_RE.test(key)) throw new EnvdError("invalid_argument", `invalid metadata key '${key}'`, { key });
    if (!VALUE_RE.test(value)) throw new EnvdError("invalid_argument", `invalid metadata value for key '${key}'`, { key });
    out[key] = value;
  }
  return out;
}

/** The metadata stored on `path`; empty when none or when the filesystem has no xattrs. */
export function readMetadata(path: string): Record<string, string> {
  let names: string[];
  try {
    names = listXattrs(path);
  } catch {
    return {};
  }
  const out: Record<string, string> = {};
  for (const n of names) {
    if (!n.startsWith(PREFIX)) continue;
    try {
      const v = getXattr(path, n);
      if (v !== undefined) out[n.slice(PREFIX.length)] = v;
    } catch {
      /* removed meanwhile */
    }
  }
  return out;
}

/**
 * Replace the metadata set of `path` with `meta`.
 * @throws EnvdError `invalid_argument` when metadata is given but the filesystem has no user
 *   xattrs; `internal` for other failures.
 */
export function replaceMetadata(path: string, meta: Record<string, string>): void {
  const wanted = Object.keys(meta).length > 0;
  try {
    for (const n of listXattrs(path)) if (n.startsWith(PREFIX)) removeXattr(path, n);
    for (const [k, v] of Object.entries(meta)) setXattr(path, PREFIX + k, v);
  } catch (err) {
    if (err instanceof XattrError && err.code === "xattr.unsupported") {
      if (!wanted) return;
      throw new EnvdError("invalid_argument", `the filesystem of '${path}' does not support file metadata`, { path }, { cause: err });
    }
    throw new EnvdError("internal", `cannot store metadata on '${path}': ${errorMessage(err)}`, { path }, { cause: err });
  }
}
