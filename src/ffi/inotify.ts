/**
 * inotify(7) through libc via bun:ffi: create an instance, add/remove watches, and decode the
 * event records read from it. Reading is left to the caller (a blocking fd; envd relays it
 * through a child `cat` so Bun polls a pipe instead of parking a pool thread).
 * Sources: inotify(7), include/uapi/linux/inotify.h.
 */
import { closeSync, fchmodSync, ftruncateSync } from "node:fs";
import { ptr } from "bun:ffi";
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc } from "./libc.ts";

/** Thrown when an inotify call fails; `details.errno` holds the C errno. */
export class InotifyError extends AgentEnvError<FfiCodes<"inotify">> {}

// include/uapi/linux/inotify.h
export const IN_MODIFY = 0x00000002;
export const IN_ATTRIB = 0x00000004;
export const IN_CLOSE_WRITE = 0x00000008;
export const IN_MOVED_FROM = 0x00000040;
export const IN_MOVED_TO = 0x00000080;
export const IN_CREATE = 0x00000100;
export const IN_DELETE = 0x00000200;
export const IN_DELETE_SELF = 0x00000400;
export const IN_MOVE_SELF = 0x00000800;
export const IN_Q_OVERFLOW = 0x00004000;
export const IN_IGNORED = 0x00008000;
export const IN_ONLYDIR = 0x01000000;
export const IN_DONT_FOLLOW = 0x02000000;
export const IN_ISDIR = 0x40000000;
export const IN_CLOEXEC = 0o2000000;

// struct inotify_event { int wd; uint32_t mask; uint32_t cookie; uint32_t len; char name[]; }
export const EVENT_HEADER_SIZE = 16;
const EV_WD = 0;
const EV_MASK = 4;
const EV_COOKIE = 8;
const EV_LEN = 12;

const ENOENT = 2;
const ENOTDIR = 20;
const ENOSPC = 28;



/**
 * New inotify instance (close-on-exec, blocking reads).
 * @throws InotifyError `inotify.init_failed` (e.g. EMFILE: fs.inotify.max_user_instances).
 */
export function inotifyInit(): number {
  const fd = libc().inotify_init1(IN_CLOEXEC);
  if (fd < 0) throw new InotifyError("inotify.init_failed", "inotify_init1 failed", { errno: errno() });
  return fd;
}

/**
 * Watch `path` for `mask`; returns the watch descriptor.
 * @throws InotifyError `inotify.not_found` (ENOENT/ENOTDIR), `inotify.limit` (ENOSPC: max_user_watches),
 *   `inotify.add_failed` otherwise.
 */
export function inotifyAddWatch(fd: number, path: string, mask: number): number {
  const c = Buffer.from(`${path}\0`);
  const wd = libc().inotify_add_watch(fd, ptr(c), mask >>> 0);
  if (wd < 0) {
    const e = errno();
    const code = e === ENOENT || e === ENOTDIR ? "inotify.not_found" : e === ENOSPC ? "inotify.limit" : "inotify.add_failed";
    throw new InotifyError(code, `inotify_add_watch(${path}) failed`, { errno: e, path });
  }
  return wd;
}

// include/uapi/linux/memfd.h
const MFD_CLOEXEC = 0x0001;

/**
 * A marker in an inotify instance's event queue. It watches a private memfd (through
 * /proc/self/fd, so nothing in any directory changes) on the same instance; `mark()` changes
 * that file, which queues one event with wd `wd` behind every event already queued: reading it
 * back means every event queued before the mark was read. Consecutive marks alternate between
 * IN_MODIFY (ftruncate) and IN_ATTRIB (fchmod), since the kernel merges an event identical to
 * the last queued one (fs/notify/inotify/inotify_fsnotify.c, inotify_merge), so every mark
 * arrives as one event of its own, in order. (Writes through a memfd raise no event; size and
 * mode changes do.)
 */
export class InotifyFence {
  /** Watch descriptor the marks arrive with. */
  readonly wd: number;
  private readonly file: number;
  private marks = 0;

  /**
   * Add a fence to inotify instance `fd`.
   * @throws InotifyError `inotify.fence_failed` (memfd_create or the watch failed; errno).
   */
  constructor(fd: number) {
    const file = libc().memfd_create(ptr(Buffer.from("inotify-fence\0")), MFD_CLOEXEC);
    if (file < 0) throw new InotifyError("inotify.fence_failed", "memfd_create failed", { call: "memfd_create", errno: errno() });
    const wd = libc().inotify_add_watch(fd, ptr(Buffer.from(`/proc/self/fd/${file}\0`)), (IN_MODIFY | IN_ATTRIB) >>> 0);
    if (wd < 0) {
      const e = errno();
      closeSync(file);
      throw new InotifyError("inotify.fence_failed", "inotify_add_watch of the fence file failed", { call: "inotify_add_watch", errno: e });
    }
    this.file = file;
    this.wd = wd;
  }

  /** Queue one mark; returns its number (0, 1, 2, ...: marks are read back in this order). */
  mark(): number {
    const n = this.marks++;
    if (n % 2 === 0) ftruncateSync(this.file, (n / 2) % 2);
    else fchmodSync(this.file, 0o600);
    return n;
  }

  /** Close the private file (the watch goes with the inotify instance). */
  close(): void {
    try {
      closeSync(this.file);
    } catch {
      /* already closed */
    }
  }
}

/** One decoded event record. */
export interface InotifyEvent {
  wd: number;
  mask: number;
  cookie: number;
  /** Entry name inside the watched directory; "" for events on the directory itself. */
  name: string;
}

/**
 * Incremental decoder: feed it bytes as they arrive (records may be split across chunks) and
 * get whole events back.
 */
export class InotifyDecoder {
  private pending: Buffer = Buffer.alloc(0);

  /** Append bytes; returns every event now complete. */
  push(chunk: Uint8Array): InotifyEvent[] {
    this.pending = this.pending.length ? Buffer.concat([this.pending, chunk]) : Buffer.from(chunk);
    const out: InotifyEvent[] = [];
    let off = 0;
    while (this.pending.length - off >= EVENT_HEADER_SIZE) {
      const len = this.pending.readUInt32LE(off + EV_LEN);
      if (this.pending.length - off < EVENT_HEADER_SIZE + len) break;
      const nameBytes = this.pending.subarray(off + EVENT_HEADER_SIZE, off + EVENT_HEADER_SIZE + len);
      const nul = nameBytes.indexOf(0);
      out.push({
        wd: this.pending.readInt32LE(off + EV_WD),
        mask: this.pending.readUInt32LE(off + EV_MASK),
        cookie: this.pending.readUInt32LE(off + EV_COOKIE),
        name: nameBytes.subarray(0, nul < 0 ? len : nul).toString("utf8"),
      });
      off += EVENT_HEADER_SIZE + len;
    }
    this.pending = this.pending.subarray(off);
    return out;
  }
}
