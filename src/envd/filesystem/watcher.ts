/**
 * Directory watching with inotify (src/ffi/inotify.ts), mapped to envd's EventType the way
 * E2B's envd (fsnotify) reports it: IN_CREATE/IN_MOVED_TO = CREATE, IN_MODIFY = WRITE,
 * IN_DELETE = REMOVE, IN_MOVED_FROM = RENAME, IN_ATTRIB = CHMOD. Recursive watches add a watch
 * per subdirectory, including directories created later. The blocking inotify fd is relayed
 * through a child `cat` so Bun reads a pipe it can poll. An upload (written to a temporary file,
 * then renamed over its target) is reported as E2B's in-place write is (`uploadEvent`).
 */
import { closeSync, lstatSync, readdirSync, type BigIntStats } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { create } from "@bufbuild/protobuf";
import {
  IN_ATTRIB,
  IN_CREATE,
  IN_DELETE,
  IN_DELETE_SELF,
  IN_DONT_FOLLOW,
  IN_IGNORED,
  IN_ISDIR,
  IN_MODIFY,
  IN_MOVE_SELF,
  IN_MOVED_FROM,
  IN_MOVED_TO,
  IN_ONLYDIR,
  IN_Q_OVERFLOW,
  InotifyDecoder,
  InotifyError,
  InotifyFence,
  inotifyAddWatch,
  inotifyInit,
  type InotifyEvent,
} from "../../ffi/inotify.ts";
import { logger } from "../log.ts";
import { EnvdError } from "../errors.ts";
import { EventType, FilesystemEventSchema, type FilesystemEvent } from "../gen/filesystem_pb.ts";
import { uploadTargetOf } from "../upload-names.ts";
import { loadAccountNames } from "../users.ts";
import { entryFromStats } from "./entry.ts";
import { LruMap } from "../../util/lru.ts";
import { asError, errorMessage } from "../../util/error.ts";

const log = logger("envd.watch");

const WATCH_MASK =
  IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW;

/** Bound on the uploads one watcher follows at once (the oldest is forgotten past it). */
const MAX_UPLOADS_TRACKED = 1024;

/** An upload's temporary file as a watcher follows it: whether its target existed, whether bytes were written. */
interface Upload {
  existed: boolean;
  wrote: boolean;
}

/** What a watcher was asked for. */
export interface WatchSpec {
  /** Absolute directory. */
  path: string;
  recursive: boolean;
  includeEntry: boolean;
}

/** Bounds and tools for watchers. */
export interface WatchLimits {
  /** Most directories one recursive watcher follows. */
  maxDirs: number;
  /** Absolute path of `cat`. */
  catPath: string;
}

/** EventType for an inotify mask (one record may carry one of these bits). */
export function eventTypeOf(mask: number): EventType | undefined {
  if (mask & (IN_CREATE | IN_MOVED_TO)) return EventType.CREATE;
  if (mask & IN_MODIFY) return EventType.WRITE;
  if (mask & IN_DELETE) return EventType.REMOVE;
  if (mask & IN_MOVED_FROM) return EventType.RENAME;
  if (mask & IN_ATTRIB) return EventType.CHMOD;
  return undefined;
}

/** A live watch; `close()` releases the inotify fd and the relay process. */
export interface DirWatch {
  close(): void;
}

/**
 * Start watching. `onEvent` gets each event (names relative to `spec.path`); `onError` is
 * called once if the watch ends abnormally (watched directory removed, queue overflow).
 * @throws EnvdError `not_found` when the directory is missing, `resource_exhausted` past limits.
 */
export function startWatch(spec: WatchSpec, limits: WatchLimits, onEvent: (ev: FilesystemEvent) => void, onError: (err: Error) => void): DirWatch {
  let fd: number;
  try {
    fd = inotifyInit();
  } catch (err) {
    throw new EnvdError("resource_exhausted", `cannot create an inotify instance: ${errorMessage(err)}`, { path: spec.path }, { cause: err });
  }
  const dirs = new Map<number, string>(); // wd -> path relative to the root ("" = root)
  let closed = false;

  /**
   * Entries the scan of a newly followed directory reported, with the queued events that scan
   * covers (see `follow`: the first create; the first write when `write`) and the fence mark
   * queued during that scan. Once the mark is read, no covered event is left: the record goes,
   * and every later event of the entry is reported. Bounded (oldest dropped: at worst a
   * duplicate, never a lost event).
   */
  const scanned = new LruMap<string, { create: boolean; write: boolean; mark: number }>(limits.maxDirs);
  let fence: InotifyFence | undefined;
  /** Marks read back so far (marks arrive in the order they were made). */
  let marksRead = 0;
  /** Cleared by a queue overflow: marks may be lost with it, so scans stop recording. */
  let dedupe = true;
  /** Names recorded under each mark not read back yet. */
  const byMark = new Map<number, string[]>();
  const remember = (rel: string, write: boolean, mark: number) => {
    if (!dedupe) return;
    scanned.set(rel, { create: true, write, mark });
    const names = byMark.get(mark);
    if (names) names.push(rel);
    else byMark.set(mark, [rel]);
  };
  const markRead = () => {
    const k = marksRead++;
    for (const name of byMark.get(k) ?? []) if (scanned.peek(name)?.mark === k) scanned.delete(name);
    byMark.delete(k);
  };

  /** Add one directory's watch. Returns false when it vanished meanwhile. */
  const watchDir = (rel: string): boolean => {
    if (dirs.size >= limits.maxDirs) {
      throw new EnvdError("resource_exhausted", `watch covers more than ${limits.maxDirs} directories`, { path: spec.path, limit: limits.maxDirs });
    }
    const abs = rel ? join(spec.path, rel) : spec.path;
    let wd: number;
    try {
      wd = inotifyAddWatch(fd, abs, WATCH_MASK);
    } catch (err) {
      if (err instanceof InotifyError && err.code === "inotify.not_found") {
        if (!rel) throw new EnvdError("not_found", `path '${abs}' does not exist`, { path: abs });
        return false;
      }
      if (err instanceof InotifyError && err.code === "inotify.limit") {
        throw new EnvdError("resource_exhausted", "inotify watch limit reached (fs.inotify.max_user_watches)", { path: abs });
      }
      throw new EnvdError("internal", errorMessage(err), { path: abs }, { cause: err });
    }
    dirs.set(wd, rel);
    return true;
  };

  /**
   * Follow directory `rel` and everything below it: its watch first, then its entries. With
   * `report`, each entry found is reported with the events it would have had, in order (create;
   * write when it is a non-empty file; then a directory's own entries), since whatever happened
   * in it before its watch existed raised no event. The initial watch follows silently.
   *
   * Which queued events the scan already covers: watch, list, lstat every entry, fence mark,
   * lstat the files again. Events queued before the mark happened before the mark; the entries
   * listed existed before it, so the first queued create of each is the one reported here. A
   * file whose second lstat matches its first (inode, size, mtime, ctime) was not written
   * between its first lstat and the mark: its writes queued before the mark came before the
   * first lstat, which saw them, and the first is skipped. A file that changed meanwhile had a
   * write the scan may not have seen: all its write events are reported (at worst one more
   * WRITE than writes). An entry made after the listing has its own create.
   */
  const follow = (rel: string, report: boolean) => {
    if (!watchDir(rel)) return;
    let names: string[] = [];
    try {
      names = readdirSync(rel ? join(spec.path, rel) : spec.path);
    } catch {
      return;
    }
    const found: { rel: string; st: BigIntStats }[] = [];
    for (const n of names) {
      if (uploadTargetOf(n) !== null) continue; // an upload in progress: reported when it completes
      const childRel = rel ? `${rel}/${n}` : n;
      try {
        found.push({ rel: childRel, st: lstatSync(join(spec.path, childRel), { bigint: true }) });
      } catch {
        /* raced with a delete */
      }
    }
    const mark = report && found.length > 0 ? fence!.mark() : -1;
    for (const { rel: childRel, st } of found) {
      if (report) {
        const write = st.isFile() && st.size > 0n;
        emit(childRel, EventType.CREATE);
        if (write) emit(childRel, EventType.WRITE);
        remember(childRel, write && unchanged(childRel, st), mark);
      }
      if (st.isDirectory()) follow(childRel, report);
    }
  };

  /** True when `rel` still is the file `before` describes: same inode, size, mtime and ctime. */
  const unchanged = (rel: string, before: BigIntStats): boolean => {
    try {
      const now = lstatSync(join(spec.path, rel), { bigint: true });
      return now.ino === before.ino && now.size === before.size && now.mtimeNs === before.mtimeNs && now.ctimeNs === before.ctimeNs;
    } catch {
      return false;
    }
  };

  let relay: Subprocess<number, "pipe", "ignore"> | undefined;
  try {
    if (spec.recursive) {
      fence = new InotifyFence(fd);
      follow("", false);
    } else watchDir("");
    relay = Bun.spawn([limits.catPath], { stdin: fd, stdout: "pipe", stderr: "ignore" });
  } catch (err) {
    fence?.close();
    closeSync(fd);
    if (err instanceof InotifyError) throw new EnvdError("internal", err.message, { path: spec.path, ...err.details }, { cause: err });
    throw err;
  }

  const close = () => {
    if (closed) return;
    closed = true;
    relay?.kill("SIGKILL");
    fence?.close();
    try {
      closeSync(fd);
    } catch {
      /* already closed */
    }
  };

  const handle = (ev: InotifyEvent) => {
    if (ev.mask & IN_Q_OVERFLOW) {
      log.warn({ path: spec.path }, "inotify queue overflow; events lost");
      dedupe = false;
      scanned.clear();
      byMark.clear();
      return;
    }
    if (fence && ev.wd === fence.wd) {
      if (!(ev.mask & IN_IGNORED)) markRead();
      return;
    }
    const rel = dirs.get(ev.wd);
    if (ev.mask & IN_IGNORED) {
      dirs.delete(ev.wd);
      if (rel === "") {
        close();
        onError(new Error(`watched directory '${spec.path}' was removed or moved`));
      }
      return;
    }
    if (rel === undefined || !ev.name) return; // self events: the parent reports them
    const name = rel ? `${rel}/${ev.name}` : ev.name;
    if (uploadEvent(ev, rel, name)) return;
    const type = eventTypeOf(ev.mask);
    if (type === undefined) return;
    const prior = scanned.peek(name);
    if (prior && type === EventType.CREATE && prior.create) {
      prior.create = false; // the scan reported (and followed) it already
      return;
    }
    if (prior && type === EventType.WRITE && prior.write) {
      prior.write = false;
      return;
    }
    if (type === EventType.REMOVE || type === EventType.RENAME) scanned.delete(name);
    emit(name, type);
    if (spec.recursive && ev.mask & IN_ISDIR && type === EventType.CREATE) {
      try {
        // entries made between the mkdir and our watch raised no event: they are reported now
        follow(name, true);
      } catch (err) {
        log.warn({ path: spec.path, name, err: errorMessage(err) }, "cannot follow new directory");
      }
    }
  };

  /** Uploads in progress (by their temporary file's name), and those renamed away (by inotify cookie). */
  const uploads = new Map<string, Upload>();
  const renamedUploads = new Map<number, Upload>();
  /**
   * An event of an upload's temporary file (src/envd/upload-names.ts), or of the rename that
   * completes it: nothing is reported for the temporary file; the rename over the target is
   * reported as E2B's in-place write is: a create when the target was new, a write when bytes
   * were written or an old file replaced. An upload cut short reports nothing (the target is as
   * it was). @returns true when `ev` was such an event (handled here)
   */
  const uploadEvent = (ev: InotifyEvent, rel: string, name: string): boolean => {
    const target = uploadTargetOf(ev.name);
    if (target !== null) {
      if (ev.mask & IN_CREATE) {
        if (uploads.size >= MAX_UPLOADS_TRACKED) uploads.delete(uploads.keys().next().value!);
        let existed = true;
        try {
          lstatSync(join(spec.path, rel, target));
        } catch {
          existed = false;
        }
        uploads.set(name, { existed, wrote: false });
      } else if (ev.mask & IN_MODIFY) {
        const u = uploads.get(name);
        if (u) u.wrote = true;
      } else if (ev.mask & IN_MOVED_FROM) {
        const u = uploads.get(name);
        uploads.delete(name);
        if (u) {
          if (renamedUploads.size >= MAX_UPLOADS_TRACKED) renamedUploads.delete(renamedUploads.keys().next().value!);
          renamedUploads.set(ev.cookie, u);
        }
      } else if (ev.mask & IN_DELETE) uploads.delete(name);
      return true;
    }
    if (!(ev.mask & IN_MOVED_TO)) return false;
    const u = renamedUploads.get(ev.cookie);
    if (!u) return false;
    renamedUploads.delete(ev.cookie);
    scanned.delete(name);
    if (!u.existed) emit(name, EventType.CREATE);
    if (u.wrote || u.existed) emit(name, EventType.WRITE);
    return true;
  };

  const emit = (name: string, type: EventType) => {
    const out = create(FilesystemEventSchema, { name, type });
    if (spec.includeEntry && type !== EventType.REMOVE && type !== EventType.RENAME) {
      const full = join(spec.path, name);
      try {
        out.entry = entryFromStats(full, lstatSync(full), loadAccountNames());
      } catch {
        /* gone again: no entry */
      }
    }
    onEvent(out);
  };

  void (async () => {
    const decoder = new InotifyDecoder();
    try {
      for await (const chunk of relay!.stdout) {
        for (const ev of decoder.push(chunk)) if (!closed) handle(ev);
      }
    } catch (err) {
      if (!closed) onError(asError(err));
    }
  })();

  return { close };
}
