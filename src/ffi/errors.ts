import { AgentEnvError, type ErrorTable } from "../errors.ts";

/**
 * Failures of kernel interfaces called through bun:ffi; `details.errno` holds the C errno.
 * Each module's error class takes the codes of its own prefix. Adding a code: see src/errors.ts.
 */
export const FFI_ERRORS = {
  "syscall.failed": "a file system call (lseek, fallocate, ...) failed (details.call, errno)",
  "flock.failed": "open(2) or flock(2) of a lock file failed (details.call, path, errno)",
  "io_uring.failed": "an io_uring setup, mmap or enter failed (details.call, errno)",
  "inotify.init_failed": "inotify_init1 failed (details.errno)",
  "inotify.not_found": "the path to watch does not exist or is not a directory (details.path)",
  "inotify.limit": "fs.inotify.max_user_watches reached",
  "inotify.add_failed": "inotify_add_watch failed otherwise (details.path, errno)",
  "inotify.fence_failed": "the private file of an inotify fence could not be made or watched (details.call, errno)",
  "pty.open_failed": "openpty failed (details.errno)",
  "pty.resize_failed": "ioctl(TIOCSWINSZ) failed (details.fd, errno)",
  "xattr.unsupported": "the file system does not support extended attributes (details.path)",
  "xattr.not_found": "the path does not exist (details.path)",
  "xattr.failed": "an xattr call failed otherwise (details.path, name, errno)",
  "mount.failed": "mount(2) failed (details.target, fstype, errno)",
  "mount.bad_argument": "a mount argument holds a NUL byte or is empty",
  "random.failed": "feeding or reseeding the kernel's random generator failed (details.call, errno)",
  "sockopt.failed": "getsockopt(2) on a socket failed (details.option, fd, errno)",
  "ksm.failed": "a kernel samepage merging call failed: prctl(PR_SET_MEMORY_MERGE) or a write under /sys/kernel/mm/ksm (details.call, errno or path)",
  "procmem.failed": "reading another process's maps, pagemap or memory failed (details.pid, what)",
} as const satisfies ErrorTable;
/** An FFI error code. */
export type FfiErrorCode = keyof typeof FFI_ERRORS;
/** The codes of one prefix, e.g. `FfiCodes<"pty">`. */
export type FfiCodes<P extends string> = Extract<FfiErrorCode, `${P}.${string}`>;

/** A failed system call: `call` names it, `errno` is the raw number. */
export class SyscallError extends AgentEnvError<FfiCodes<"syscall">> {
  constructor(
    readonly call: string,
    readonly errno: number,
  ) {
    super("syscall.failed", `${call} failed: errno ${errno}`, { call, errno });
  }
}
