/**
 * `filesystem.Filesystem` Connect service (docs/e2b-contract.md §4.3). Paths resolve per user
 * (paths.ts), rights are checked for that user and created entries belong to them.
 */
import { lstatSync, readdirSync, renameSync, rmSync, statfsSync, statSync, type Stats } from "node:fs";
import { dirname, join } from "node:path";
import type { ServiceImpl } from "@connectrpc/connect";
import { rpcUser } from "../auth.ts";
import { EnvdError, fromFsError, toConnectError } from "../errors.ts";
import { Filesystem, type EntryInfo, type FilesystemEvent } from "../gen/filesystem_pb.ts";
import { resolvePath } from "../paths.ts";
import { checkedAs, ensureDirs, requireAccess, requireParentWritable, R_OK, X_OK } from "../permissions.ts";
import { keepaliveMs } from "../process/service.ts";
import { EventQueue } from "../queue.ts";
import type { EnvdState } from "../state.ts";
import { loadAccountNames, type AccountNames, type UserInfo } from "../users.ts";
import { entryFromStats, entryInfo } from "./entry.ts";
import { startWatch, type DirWatch, type WatchSpec } from "./watcher.ts";
import { errorCode } from "../../util/error.ts";

/** Bounds from config (`[envd]`). */
export interface FilesystemServiceOptions {
  defaultKeepaliveS: number;
  /** Most entries one ListDir returns. */
  maxListEntries: number;
  /** Most polling watchers (CreateWatcher) alive at once. */
  maxWatchers: number;
  /** Events a polling watcher keeps between GetWatcherEvents calls (oldest dropped). */
  maxWatcherEvents: number;
  /** Events buffered per WatchDir stream. */
  queueHighWater: number;
  /** Most directories one recursive watch follows. */
  maxWatchDirs: number;
  /** Absolute path of `cat` (inotify relay). */
  catPath: string;
}

// f_type values of network and FUSE filesystems, include/uapi/linux/magic.h
const NETWORK_FS_MAGIC = new Set([0x6969 /* NFS */, 0x517b /* SMB */, 0xff534d42 /* CIFS */, 0xfe534d42 /* SMB2 */, 0x65735546 /* FUSE */]);

/** True when `path` lives on NFS, SMB/CIFS or FUSE (inotify events there are unreliable). */
export function isNetworkMount(path: string): boolean {
  try {
    return NETWORK_FS_MAGIC.has(Number(statfsSync(path).type) >>> 0);
  } catch {
    return false;
  }
}

function statOrThrow(path: string, op: string): Stats {
  try {
    return statSync(path);
  } catch (err) {
    throw fromFsError(err, path, op);
  }
}

/**
 * Walk `root` down `depth` levels (1 = direct children), not following symlinks.
 * @param checker identity whose read rights on `root` are required (see `checkedAs`).
 */
export function listDir(root: string, depth: number, names: AccountNames, checker: UserInfo, limit: number): EntryInfo[] {
  const out: EntryInfo[] = [];
  const walk = (dir: string, level: number) => {
    let children: string[];
    try {
      children = readdirSync(dir).sort();
    } catch (err) {
      if (level === 1) throw fromFsError(err, dir, "list");
      return; // unreadable subdirectory: skip, like E2B's walk
    }
    for (const name of children) {
      const full = join(dir, name);
      let st: Stats;
      try {
        st = lstatSync(full);
      } catch {
        continue; // raced with a delete
      }
      if (out.length >= limit) {
        throw new EnvdError("resource_exhausted", `directory listing exceeds ${limit} entries`, { path: root, limit });
      }
      out.push(entryFromStats(full, st, names));
      if (st.isDirectory() && level < depth) walk(full, level + 1);
    }
  };
  requireAccess(checker, root, R_OK | X_OK, "list");
  walk(root, 1);
  return out;
}

interface PollWatcher {
  spec: WatchSpec;
  close(): void;
  events: FilesystemEvent[];
  error?: Error;
}

/** Implementation of `filesystem.Filesystem`; call `close()` on shutdown to stop watchers. */
export function filesystemService(state: EnvdState, opts: FilesystemServiceOptions): ServiceImpl<typeof Filesystem> & { close(): void } {
  const watchers = new Map<string, PollWatcher>();
  const watchLimits = { maxDirs: opts.maxWatchDirs, catPath: opts.catPath };

  const watchSpec = (req: { path: string; recursive: boolean; includeEntry: boolean; allowNetworkMounts: boolean }, user: UserInfo): WatchSpec => {
    const path = resolvePath(req.path, user, state.defaultWorkdir);
    const st = statOrThrow(path, "watch");
    if (!st.isDirectory()) throw new EnvdError("invalid_argument", `path '${path}' is not a directory`, { path });
    if (!req.allowNetworkMounts && isNetworkMount(path)) {
      throw new EnvdError("invalid_argument", `cannot watch path on network filesystem: ${path} (set allowNetworkMounts)`, { path });
    }
    requireAccess(checkedAs(user, state.enforcePermissions), path, R_OK | X_OK, "watch");
    return { path, recursive: req.recursive, includeEntry: req.includeEntry };
  };

  const wrap =
    <A extends unknown[], R>(fn: (...a: A) => R) =>
    async (...a: A): Promise<Awaited<R>> => {
      try {
        return await fn(...a);
      } catch (err) {
        throw toConnectError(err);
      }
    };

  return {
    stat: wrap((req, ctx) => {
      const user = rpcUser(state, ctx.requestHeader);
      const path = resolvePath(req.path, user, state.defaultWorkdir);
      return { entry: entryInfo(path, loadAccountNames()) };
    }),

    makeDir: wrap((req, ctx) => {
      const user = rpcUser(state, ctx.requestHeader);
      const path = resolvePath(req.path, user, state.defaultWorkdir);
      let existing: Stats | undefined;
      try {
        existing = statSync(path);
      } catch {
        existing = undefined;
      }
      if (existing?.isDirectory()) throw new EnvdError("already_exists", `directory '${path}' already exists`, { path });
      if (existing) throw new EnvdError("invalid_argument", `path '${path}' already exists and is not a directory`, { path });
      requireParentWritable(checkedAs(user, state.enforcePermissions), path, "make_dir");
      ensureDirs(path, user, "make_dir");
      return { entry: entryInfo(path, loadAccountNames()) };
    }),

    move: wrap((req, ctx) => {
      const user = rpcUser(state, ctx.requestHeader);
      const src = resolvePath(req.source, user, state.defaultWorkdir);
      const dst = resolvePath(req.destination, user, state.defaultWorkdir);
      try {
        lstatSync(src);
      } catch (err) {
        throw fromFsError(err, src, "move");
      }
      const checker = checkedAs(user, state.enforcePermissions);
      requireParentWritable(checker, src, "move");
      requireParentWritable(checker, dst, "move");
      ensureDirs(dirname(dst), user, "move");
      try {
        renameSync(src, dst);
      } catch (err) {
        throw fromFsError(err, dst, "move");
      }
      return { entry: entryInfo(dst, loadAccountNames()) };
    }),

    listDir: wrap((req, ctx) => {
      const user = rpcUser(state, ctx.requestHeader);
      const path = resolvePath(req.path, user, state.defaultWorkdir);
      const st = statOrThrow(path, "list");
      if (!st.isDirectory()) throw new EnvdError("invalid_argument", `path '${path}' is not a directory`, { path });
      const depth = req.depth === 0 ? 1 : req.depth;
      return { entries: listDir(path, depth, loadAccountNames(), checkedAs(user, state.enforcePermissions), opts.maxListEntries) };
    }),

    remove: wrap((req, ctx) => {
      const user = rpcUser(state, ctx.requestHeader);
      const path = resolvePath(req.path, user, state.defaultWorkdir);
      try {
        lstatSync(path);
      } catch (err) {
        // like E2B's envd (os.RemoveAll): removing what is not there succeeds
        if (errorCode(err) === "ENOENT") return {};
        throw fromFsError(err, path, "remove");
      }
      requireParentWritable(checkedAs(user, state.enforcePermissions), path, "remove");
      try {
        rmSync(path, { recursive: true, force: true });
      } catch (err) {
        throw fromFsError(err, path, "remove");
      }
      return {};
    }),

    async *watchDir(req, ctx) {
      let spec: WatchSpec;
      const q = new EventQueue<{ event: { case: "start" | "filesystem" | "keepalive"; value: object } }>(opts.queueHighWater);
      let w: DirWatch;
      try {
        spec = watchSpec(req, rpcUser(state, ctx.requestHeader));
        w = startWatch(
          spec,
          watchLimits,
          (ev) => {
            if (q.size >= opts.queueHighWater) {
              q.close(new EnvdError("resource_exhausted", "watch client too slow, events overflowed", { path: spec.path }).toConnect());
            } else q.push({ event: { case: "filesystem", value: ev } });
          },
          (err) => q.close(toConnectError(new EnvdError("internal", `watch failed: ${err.message}`, { path: spec.path }))),
        );
      } catch (err) {
        throw toConnectError(err);
      }
      try {
        yield { event: { case: "start", value: {} } };
        const ka = keepaliveMs(ctx.requestHeader, opts.defaultKeepaliveS);
        for await (const ev of q.iterate(ctx.signal, ka, () => ({ event: { case: "keepalive", value: {} } }))) {
          yield ev as never;
        }
      } finally {
        w.close();
      }
    },

    createWatcher: wrap((req, ctx) => {
      if (watchers.size >= opts.maxWatchers) {
        throw new EnvdError("resource_exhausted", `too many watchers (limit ${opts.maxWatchers})`, { limit: opts.maxWatchers });
      }
      const spec = watchSpec(req, rpcUser(state, ctx.requestHeader));
      const id = `w${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`;
      const pw: PollWatcher = { spec, events: [], close: () => {} };
      const w = startWatch(
        spec,
        watchLimits,
        (ev) => {
          pw.events.push(ev);
          if (pw.events.length > opts.maxWatcherEvents) pw.events.shift();
        },
        (err) => (pw.error = err),
      );
      pw.close = () => w.close();
      watchers.set(id, pw);
      return { watcherId: id };
    }),

    getWatcherEvents: wrap((req) => {
      const pw = watchers.get(req.watcherId);
      if (!pw) throw new EnvdError("not_found", `watcher '${req.watcherId}' not found`, { watcherId: req.watcherId });
      if (pw.error) throw new EnvdError("internal", `watcher failed: ${pw.error.message}`, { watcherId: req.watcherId });
      const events = pw.events;
      pw.events = [];
      return { events };
    }),

    removeWatcher: wrap((req) => {
      const pw = watchers.get(req.watcherId);
      if (!pw) throw new EnvdError("not_found", `watcher '${req.watcherId}' not found`, { watcherId: req.watcherId });
      pw.close();
      watchers.delete(req.watcherId);
      return {};
    }),

    close() {
      for (const pw of watchers.values()) pw.close();
      watchers.clear();
    },
  };
}
