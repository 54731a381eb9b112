/**
 * Local accounts from /etc/passwd and /etc/group (re-read on use: commands in the sandbox may
 * add users at any time). envd runs as root and acts for these users.
 */
import { readFileSync } from "node:fs";
import { EnvdError } from "./errors.ts";

/** One /etc/passwd entry. */
export interface UserInfo {
  name: string;
  uid: number;
  gid: number;
  home: string;
  shell: string;
}

/** Name tables for uid/gid -> name, e.g. for EntryInfo.owner/group. */
export interface AccountNames {
  userName(uid: number): string;
  groupName(gid: number): string;
}

function readLines(path: string): string[][] {
  let text = "";
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return [];
  }
  return text
    .split("\n")
    .filter((l) => l && !l.startsWith("#"))
    .map((l) => l.split(":"));
}

/** root as the kernel knows it, for root filesystems without an /etc/passwd entry for it. */
const ROOT_USER: UserInfo = { name: "root", uid: 0, gid: 0, home: "/root", shell: "/bin/sh" };

/**
 * Look a user up by name. `root` exists even when /etc/passwd lacks it (an image with no
 * /etc at all still runs commands as uid 0).
 * @throws EnvdError `unauthenticated` when the user does not exist (E2B answers 401 /
 *   `unauthenticated` for an unknown user).
 */
export function lookupUser(name: string, passwdPath = "/etc/passwd"): UserInfo {
  for (const f of readLines(passwdPath)) {
    if (f[0] === name && f.length >= 7) {
      return { name, uid: Number(f[2]), gid: Number(f[3]), home: f[5] || "/", shell: f[6] || "/bin/sh" };
    }
  }
  if (name === ROOT_USER.name) return { ...ROOT_USER };
  throw new EnvdError("unauthenticated", `invalid username: '${name}'`, { user: name });
}

/** Snapshot of uid/gid names; unknown ids print as numbers like `ls -l` does. */
export function loadAccountNames(passwdPath = "/etc/passwd", groupPath = "/etc/group"): AccountNames {
  const users = new Map<number, string>();
  for (const f of readLines(passwdPath)) if (f.length >= 3) users.set(Number(f[2]), f[0]!);
  const groups = new Map<number, string>();
  for (const f of readLines(groupPath)) if (f.length >= 3) groups.set(Number(f[2]), f[0]!);
  return {
    userName: (uid) => users.get(uid) ?? String(uid),
    groupName: (gid) => groups.get(gid) ?? String(gid),
  };
}

/** Group ids a user belongs to: primary gid plus /etc/group memberships. */
export function userGroups(user: UserInfo, groupPath = "/etc/group"): Set<number> {
  const gids = new Set([user.gid]);
  for (const f of readLines(groupPath)) {
    if (f.length >= 4 && f[3]!.split(",").includes(user.name)) gids.add(Number(f[2]));
  }
  return gids;
}
