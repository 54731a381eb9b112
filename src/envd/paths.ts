/**
 * Path resolution as E2B's envd does it (`permissions.ExpandAndResolve`, infra
 * packages/envd/internal/permissions/path.go; ../shared/docs/e2b-contract.md §3.1): an empty path
 * is the default workdir from /init (else the user's home); `~` and `~/x` expand to the user's
 * home; any other relative path resolves against the home of the user the request acts as (never
 * the default workdir: `username=root` puts `a.txt` in /root). The result is normalised and
 * absolute.
 */
import { isAbsolute, join, normalize, resolve } from "node:path";
import { EnvdError } from "./errors.ts";
import type { UserInfo } from "./users.ts";

/**
 * Resolve `path` for `user`.
 * @param defaultWorkdir what an empty path means, when /init set one.
 * @throws EnvdError `invalid_argument` for a path containing NUL.
 */
export function resolvePath(path: string, user: UserInfo, defaultWorkdir?: string): string {
  if (path.includes("\0")) throw new EnvdError("invalid_argument", "path contains a NUL byte", { path });
  if (path === "") return normalize(defaultWorkdir || user.home);
  if (path === "~") return normalize(user.home);
  if (path.startsWith("~/")) return normalize(join(user.home, path.slice(2)));
  if (isAbsolute(path)) return normalize(path);
  return resolve(user.home, path);
}

/** Resolve a process's working directory: absent or empty is the default workdir, else as `resolvePath`. */
export function resolveCwd(cwd: string | undefined, user: UserInfo, defaultWorkdir?: string): string {
  return resolvePath(cwd ?? "", user, defaultWorkdir);
}
