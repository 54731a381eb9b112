/**
 * One node per runtime path and per network name prefix on a host. Before a node reaps anything
 * (VMM leftovers, disk exports, `<name_prefix>*` namespaces) it takes two exclusive flocks:
 * `<runtime_path>/node.lock` and the host-wide `/run/agentenv-net-<prefix>.lock`. The kernel
 * drops them when the process dies (kill -9 included), so a crashed node never blocks a restart.
 * Each lock file holds the owner's `{pid, runtimePath, namePrefix}` (JSON) for the conflict message.
 */
import { type Static, Type as T } from "@sinclair/typebox";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tryFlockExclusive, type HeldFlock } from "../ffi/flock.ts";
import { jsonSchema } from "../util/json-check.ts";
import { NodeError } from "./errors.ts";
import { errorMessage } from "../util/error.ts";

/** Directory of the host-wide per-prefix locks. */
export const HOST_LOCK_DIR = "/run";

/** Path of the host-wide lock of network name prefix `prefix` in `dir`. */
export function netLockPath(prefix: string, dir = HOST_LOCK_DIR): string {
  return join(dir, `agentenv-net-${prefix.replace(/[^A-Za-z0-9_-]/g, "_")}.lock`);
}

/** The two locks a running node holds; `release()` is idempotent. */
export interface NodeLocks {
  paths: string[];
  release(): void;
}

/** What a lock file says of its owner (written by another process: read checked). */
const OWNER = jsonSchema(T.Object({ pid: T.Optional(T.Integer({ minimum: 1 })), runtimePath: T.Optional(T.String()), namePrefix: T.Optional(T.String()) }));

/** The owner a lock file names; nothing known when it cannot be read or is not an owner record. */
function owner(path: string): Static<typeof OWNER.schema> {
  try {
    const r = OWNER.parse(readFileSync(path, "utf8"));
    return r.ok ? r.value : {};
  } catch {
    return {};
  }
}

/**
 * Take both locks, runtime path first.
 * @throws NodeError `node.already_running` (details: pid, runtimePath, namePrefix, lockPath) when
 *   another process holds either; `node.lock_failed` when a lock file cannot be opened.
 */
export function acquireNodeLocks(runtimePath: string, namePrefix: string, hostLockDir = HOST_LOCK_DIR): NodeLocks {
  const held: HeldFlock[] = [];
  const releaseAll = () => {
    for (const h of held.splice(0)) h.release();
  };
  const me = JSON.stringify({ pid: process.pid, runtimePath, namePrefix }) + "\n";
  try {
    for (const [dir, path] of [
      [runtimePath, join(runtimePath, "node.lock")],
      [hostLockDir, netLockPath(namePrefix, hostLockDir)],
    ] as const) {
      let h: HeldFlock | null;
      try {
        mkdirSync(dir, { recursive: true });
        h = tryFlockExclusive(path);
      } catch (e) {
        throw new NodeError("node.lock_failed", `cannot lock ${path}: ${errorMessage(e)}`, { lockPath: path });
      }
      if (!h) {
        const o = owner(path);
        throw new NodeError(
          "node.already_running",
          `another node is running (pid ${o.pid ?? "unknown"}) with runtime path ${o.runtimePath ?? "?"} / network prefix ${o.namePrefix ?? "?"} (lock ${path})`,
          { pid: o.pid ?? null, runtimePath: o.runtimePath ?? null, namePrefix: o.namePrefix ?? null, lockPath: path },
        );
      }
      held.push(h);
      writeFileSync(path, me); // another descriptor: the flock stays with h
    }
  } catch (e) {
    releaseAll();
    throw e;
  }
  return { paths: held.map((h) => h.path), release: releaseAll };
}
