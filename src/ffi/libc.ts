/**
 * The one binding of glibc through bun:ffi: every libc function the project calls, opened by one
 * `dlopen("libc.so.6")` on first use (nothing happens at import), and one `errno()` reader.
 * Signatures from the man pages (section 2/3) for x86_64 Linux. `ioctl` is variadic in C; its
 * third argument is bound as a pointer-sized value, so an integer argument (FICLONE's source fd)
 * is passed as a plain number and a struct argument (TIOCSWINSZ's winsize) as a buffer.
 *
 * `openpty` lives in libc.so.6 since glibc 2.34 (Debian 12 ships 2.36) and in libutil.so.1
 * before: it is resolved separately, on first use, from libc first.
 *
 * Adding a function: add its signature to SYMBOLS; call it as `libc().name(...)`.
 */
import { dlopen, FFIType, read, type Pointer } from "bun:ffi";

const SYMBOLS = {
  __errno_location: { args: [], returns: FFIType.ptr },
  // files and locks
  open: { args: [FFIType.cstring, FFIType.i32, FFIType.u32], returns: FFIType.i32 },
  close: { args: [FFIType.i32], returns: FFIType.i32 },
  flock: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 },
  lseek: { args: [FFIType.i32, FFIType.i64, FFIType.i32], returns: FFIType.i64 },
  fallocate: { args: [FFIType.i32, FFIType.i32, FFIType.i64, FFIType.i64], returns: FFIType.i32 },
  ioctl: { args: [FFIType.i32, FFIType.u64, FFIType.ptr], returns: FFIType.i32 },
  eventfd: { args: [FFIType.u32, FFIType.i32], returns: FFIType.i32 },
  fcntl: { args: [FFIType.i32, FFIType.i32, FFIType.i64], returns: FFIType.i32 },
  // errno-returning I/O for hot loops (byte counts as numbers: i64_fast)
  read: { args: [FFIType.i32, FFIType.ptr, FFIType.u64], returns: FFIType.i64_fast },
  write: { args: [FFIType.i32, FFIType.ptr, FFIType.u64], returns: FFIType.i64_fast },
  pread: { args: [FFIType.i32, FFIType.ptr, FFIType.u64, FFIType.i64], returns: FFIType.i64_fast },
  pwrite: { args: [FFIType.i32, FFIType.ptr, FFIType.u64, FFIType.i64], returns: FFIType.i64_fast },
  // poll(2): struct pollfd[], nfds, timeout ms
  poll: { args: [FFIType.ptr, FFIType.u64, FFIType.i32], returns: FFIType.i32 },
  // epoll
  epoll_create1: { args: [FFIType.i32], returns: FFIType.i32 },
  epoll_ctl: { args: [FFIType.i32, FFIType.i32, FFIType.i32, FFIType.ptr], returns: FFIType.i32 },
  epoll_wait: { args: [FFIType.i32, FFIType.ptr, FFIType.i32, FFIType.i32], returns: FFIType.i32 },
  preadv2: { args: [FFIType.i32, FFIType.ptr, FFIType.i32, FFIType.i64, FFIType.i32], returns: FFIType.i64_fast },
  // pipes and splice (zero-copy FUSE replies)
  pipe2: { args: [FFIType.ptr, FFIType.i32], returns: FFIType.i32 },
  splice: { args: [FFIType.i32, FFIType.ptr, FFIType.i32, FFIType.ptr, FFIType.u64, FFIType.u32], returns: FFIType.i64_fast },
  // sockets (a listening AF_UNIX socket handed to a child: src/ffi/unix-listen.ts)
  socket: { args: [FFIType.i32, FFIType.i32, FFIType.i32], returns: FFIType.i32 },
  bind: { args: [FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
  listen: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 },
  // getsockopt(2): SO_ORIGINAL_DST of a redirected connection (src/ffi/original-dst.ts)
  getsockopt: { args: [FFIType.i32, FFIType.i32, FFIType.i32, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  // memory
  mmap: { args: [FFIType.ptr, FFIType.u64, FFIType.i32, FFIType.i32, FFIType.i32, FFIType.i64], returns: FFIType.ptr },
  munmap: { args: [FFIType.ptr, FFIType.u64], returns: FFIType.i32 },
  // prctl(2): PR_SET_MEMORY_MERGE / PR_GET_MEMORY_MERGE (src/ffi/ksm.ts)
  prctl: { args: [FFIType.i32, FFIType.u64, FFIType.u64, FFIType.u64, FFIType.u64], returns: FFIType.i32 },
  // clock
  clock_settime: { args: [FFIType.i32, FFIType.ptr], returns: FFIType.i32 },
  // raw system calls without a glibc wrapper (io_uring_setup/enter/register)
  syscall: { args: [FFIType.i64, FFIType.i64, FFIType.i64, FFIType.i64, FFIType.i64, FFIType.i64, FFIType.i64], returns: FFIType.i64 },
  // mounts
  mount: { args: [FFIType.cstring, FFIType.cstring, FFIType.cstring, FFIType.u64, FFIType.cstring], returns: FFIType.i32 },
  umount2: { args: [FFIType.cstring, FFIType.i32], returns: FFIType.i32 },
  // inotify
  inotify_init1: { args: [FFIType.i32], returns: FFIType.i32 },
  inotify_add_watch: { args: [FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
  memfd_create: { args: [FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
  // extended attributes (never following symlinks)
  lsetxattr: { args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.u64, FFIType.i32], returns: FFIType.i32 },
  lgetxattr: { args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.u64], returns: FFIType.i64 },
  llistxattr: { args: [FFIType.ptr, FFIType.ptr, FFIType.u64], returns: FFIType.i64 },
  lremovexattr: { args: [FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
} as const;

const OPENPTY = { openpty: { args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 } } as const;

type Symbols = ReturnType<typeof dlopen<typeof SYMBOLS>>["symbols"];
type OpenptySymbols = ReturnType<typeof dlopen<typeof OPENPTY>>["symbols"];

let bound: Symbols | undefined;
let pty: OpenptySymbols | undefined;

/** The libc functions (opened on the first call of this thread's module instance). */
export function libc(): Symbols {
  bound ??= dlopen("libc.so.6", SYMBOLS).symbols;
  return bound;
}

/** `openpty(3)`, from libc.so.6 (glibc >= 2.34) or libutil.so.1. */
export function openptyFn(): OpenptySymbols["openpty"] {
  if (!pty) {
    try {
      pty = dlopen("libc.so.6", OPENPTY).symbols;
    } catch {
      pty = dlopen("libutil.so.1", OPENPTY).symbols;
    }
  }
  return pty.openpty;
}

/**
 * True when an mmap(2) result is MAP_FAILED ((void *)-1). bun:ffi returns that address as the
 * bigint 2^64-1 (too large for a number), never as -1, so `Number(p) === -1` cannot catch it.
 */
export function mapFailed(p: Pointer | bigint | null | undefined): p is null | undefined {
  return p === null || p === undefined || typeof p === "bigint" || Number(p) < 0;
}

/** errno of the last failed libc call on this thread; read it right after the call. */
export function errno(): number {
  return read.i32(libc().__errno_location() as Pointer, 0);
}
