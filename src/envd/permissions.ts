/**
 * Permission checks and ownership for file operations done on behalf of a user. envd runs as
 * root and chowns what it creates to the user. Like E2B's envd it does not check the user's
 * rights by default; with `[envd] enforce_permissions` it checks them from mode bits itself
 * (`checkedAs` picks the identity checked; root passes everything).
 */
import { chownSync, mkdirSync, statSync, type Stats } from "node:fs";
import { dirname } from "node:path";
import { EnvdError, fromFsError } from "./errors.ts";
import { userGroups, type UserInfo } from "./users.ts";
import { errorCode } from "../util/error.ts";

/** Access bits as in access(2). */
export const R_OK = 4;
export const W_OK = 2;
export const X_OK = 1;

/**
 * The identity rights are checked for: the user itself when `enforce`, else a root stand-in
 * (E2B's envd acts as root for file operations; only ownership follows the user).
 */
export function checkedAs(user: UserInfo, enforce: boolean): UserInfo {
  return enforce ? user : { ...user, uid: 0 };
}

/** Whether `user` has every bit of `want` on a file with stats `st`. */
export function allowed(user: UserInfo, st: Stats, want: number): boolean {
  if (user.uid === 0) return true;
  let bits: number;
  if (st.uid === user.uid) bits = (st.mode >> 6) & 7;
  else if (userGroups(user).has(st.gid)) bits = (st.mode >> 3) & 7;
  else bits = st.mode & 7;
  return (bits & want) === want;
}

/**
 * Require `want` on `path` (following symlinks).
 * @throws EnvdError `permission_denied`, or `not_found` when the path is missing.
 */
export function requireAccess(user: UserInfo, path: string, want: number, op: string): void {
  let st: Stats;
  try {
    st = statSync(path);
  } catch (err) {
    throw fromFsError(err, path, op);
  }
  if (!allowed(user, st, want)) {
    throw new EnvdError("permission_denied", `${op}: user '${user.name}' has no permission on '${path}'`, { path, user: user.name, op });
  }
}

/**
 * Require that `user` may create or remove an entry in the nearest existing ancestor of
 * `path` (write + search on that directory).
 */
export function requireParentWritable(user: UserInfo, path: string, op: string): void {
  if (user.uid === 0) return;
  let dir = dirname(path);
  for (;;) {
    try {
      const st = statSync(dir);
      if (!st.isDirectory()) throw new EnvdError("invalid_argument", `${op}: '${dir}' is not a directory`, { path: dir, op });
      if (!allowed(user, st, W_OK | X_OK)) {
        throw new EnvdError("permission_denied", `${op}: user '${user.name}' cannot write to '${dir}'`, { path: dir, user: user.name, op });
      }
      return;
    } catch (err) {
      if (err instanceof EnvdError) throw err;
      if (errorCode(err) !== "ENOENT" || dir === "/") throw fromFsError(err, dir, op);
      dir = dirname(dir);
    }
  }
}

/**
 * `mkdir -p` that chowns every directory it creates to the user.
 * @returns true when `dir` was created, false when it already existed as a directory.
 * @throws EnvdError `invalid_argument` when a path component is not a directory.
 */
export function ensureDirs(dir: string, user: UserInfo, op: string): boolean {
  const missing: string[] = [];
  let cur = dir;
  for (;;) {
    try {
      const st = statSync(cur);
      if (!st.isDirectory()) throw new EnvdError("invalid_argument", `${op}: '${cur}' exists and is not a directory`, { path: cur, op });
      break;
    } catch (err) {
      if (err instanceof EnvdError) throw err;
      if (errorCode(err) !== "ENOENT") throw fromFsError(err, cur, op);
      missing.push(cur);
      const up = dirname(cur);
      if (up === cur) break;
      cur = up;
    }
  }
  for (const d of missing.reverse()) {
    try {
      mkdirSync(d, { mode: 0o755 });
    } catch (err) {
      if (errorCode(err) === "EEXIST") continue;
      throw fromFsError(err, d, op);
    }
    chownTo(d, user);
  }
  return missing.length > 0;
}

/** chown to the user's uid/gid; skipped when envd itself is not root. */
export function chownTo(path: string, user: UserInfo): void {
  if (process.getuid?.() !== 0) return;
  try {
    chownSync(path, user.uid, user.gid);
  } catch (err) {
    throw fromFsError(err, path, "chown");
  }
}
