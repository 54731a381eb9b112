/**
 * Path resolution as envd does it (docs/e2b-contract.md §3.1): `~` and `~/x` expand to the
 * user's home; other relative paths resolve against the default workdir from /init, else the
 * home; the result is normalised and absolute.
 */
import { isAbsolute, join, normalize, resolve } from "node:path";
import { EnvdError } from "./errors.ts";
import type { UserInfo } from "./users.ts";

/**
 * Resolve `path` for `user`.
 * @param defaultWorkdir base for relative paths when set by /init.
 * @throws EnvdError `invalid_argument` for an empty path or one containing NUL.
 */
export function resolvePath(path: string, user: UserInfo, defaultWorkdir?: string): string {
  if (path.includes("\0")) throw new EnvdError("invalid_argument", "path contains a NUL byte", { path });
  if (path === "") throw new EnvdError("invalid_argument", "path is empty", { path });
  if (path === "~") return normalize(user.home);
  if (path.startsWith("~/")) return normalize(join(user.home, path.slice(2)));
  if (isAbsolute(path)) return normalize(path);
  return resolve(defaultWorkdir ?? user.home, path);
}

/** Resolve a working directory; empty means the default workdir, else the home. */
export function resolveCwd(cwd: string | undefined, user: UserInfo, defaultWorkdir?: string): string {
  if (!cwd) return defaultWorkdir ?? user.home;
  return resolvePath(cwd, user, defaultWorkdir);
}
