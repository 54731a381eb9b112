/**
 * Directory watching on top of `fs.watch` (inotify in Bun on Linux). fs.watch reports only
 * `rename` and `change`; they are mapped to envd's EventType by looking at the path afterwards:
 * rename + present = CREATE, rename + gone = REMOVE, change = WRITE, or CHMOD when only the
 * ctime moved (mode/owner change). Known gap: a move-away is reported as REMOVE where inotify
 * proper would say RENAME.
 */
import { lstatSync, watch, type FSWatcher } from "node:fs";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { EventType, FilesystemEventSchema, type FilesystemEvent } from "../gen/filesystem_pb.ts";
import { loadAccountNames } from "../users.ts";
import { entryFromStats } from "./entry.ts";

/** What a watcher was asked for. */
export interface WatchSpec {
  /** Absolute directory. */
  path: string;
  recursive: boolean;
  includeEntry: boolean;
}

/** Translate one fs.watch callback into a FilesystemEvent. */
export function classify(spec: WatchSpec, kind: string, name: string): FilesystemEvent {
  const full = join(spec.path, name);
  let st;
  try {
    st = lstatSync(full);
  } catch {
    st = undefined;
  }
  let type: EventType;
  if (kind === "rename") type = st ? EventType.CREATE : EventType.REMOVE;
  else type = st && st.ctimeMs > st.mtimeMs + 1 ? EventType.CHMOD : EventType.WRITE;
  const ev = create(FilesystemEventSchema, { name, type });
  if (spec.includeEntry && st) ev.entry = entryFromStats(full, st, loadAccountNames());
  return ev;
}

/**
 * Start watching; `onEvent` gets every event, `onError` once if the watch breaks (e.g. the
 * directory is removed). Close the returned watcher to stop.
 */
export function startWatch(spec: WatchSpec, onEvent: (ev: FilesystemEvent) => void, onError: (err: Error) => void): FSWatcher {
  const w = watch(spec.path, { recursive: spec.recursive, persistent: false }, (kind, name) => {
    if (name === null) return;
    onEvent(classify(spec, kind, String(name)));
  });
  w.on("error", onError);
  return w;
}
