/**
 * epoll(7) and errno-returning read/write/pread for hot loops in worker threads (the FUSE
 * reader pool; its wake-up eventfd is ./eventfd.ts): no exceptions on EAGAIN, no allocation per
 * call. Every function here returns a byte count / fd, or a negative errno, instead of throwing,
 * except the set-up calls (`epollCreate`, `setNonBlocking`), which throw `SyscallError`. Functions
 * from the one libc binding (./libc.ts), which each thread that imports it opens for itself.
 * Values from include/uapi/linux/eventpoll.h, include/uapi/asm-generic/fcntl.h and
 * include/uapi/asm-generic/errno-base.h (x86_64): EPOLL_CLOEXEC = O_CLOEXEC 02000000,
 * EPOLL_CTL_ADD 1 / DEL 2 / MOD 3, EPOLLIN 0x1, EPOLLERR 0x8, EPOLLHUP 0x10, EPOLLEXCLUSIVE 1 << 28; `struct epoll_event`
 * is packed on x86_64: u32 events @0, u64 data @4, 12 bytes. F_GETFL 3, F_SETFL 4, O_NONBLOCK 04000.
 * Safe in any thread: errno is per thread.
 */
import { ptr } from "bun:ffi";
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";

export const EPOLLIN = 0x1;
export const EPOLLERR = 0x8;
export const EPOLLHUP = 0x10;
/** Wake one of the epoll instances watching the fd, not all (Linux 4.5+). */
export const EPOLLEXCLUSIVE = 1 << 28;
/** Bytes of one `struct epoll_event` (packed on x86_64). */
export const EPOLL_EVENT_SIZE = 12;
const EPOLL_CLOEXEC = 0o2000000;
const EPOLL_CTL_ADD = 1;
const EPOLL_CTL_DEL = 2;
const F_GETFL = 3;
const F_SETFL = 4;
const O_NONBLOCK = 0o4000;

/** errno values callers branch on. */
export const Errno = { EINTR: 4, EAGAIN: 11, ENOENT: 2, ENODEV: 19, ECONNABORTED: 103 } as const;

/**
 * A new epoll instance (close-on-exec).
 * @throws SyscallError `epoll_create1`
 */
export function epollCreate(): number {
  const fd = libc().epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) throw new SyscallError("epoll_create1", errno());
  return fd;
}

/**
 * Watch `fd` in `epfd` for `events` (level-triggered); `data` (a non-negative integer below 2^32)
 * comes back with every event of it. Returns 0 or a negative errno.
 */
export function epollAdd(epfd: number, fd: number, events: number, data: number): number {
  const ev = new Uint8Array(EPOLL_EVENT_SIZE);
  const v = new DataView(ev.buffer);
  v.setUint32(0, events, true);
  v.setUint32(4, data >>> 0, true);
  return libc().epoll_ctl(epfd, EPOLL_CTL_ADD, fd, ev) < 0 ? -errno() : 0;
}

/** Stop watching `fd` in `epfd`. Returns 0 or a negative errno (ENOENT: it was not watched). */
export function epollDel(epfd: number, fd: number): number {
  return libc().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, null) < 0 ? -errno() : 0;
}

/**
 * Wait for events: fills `events` (room for `events.byteLength / 12` entries) and returns how many
 * arrived, or a negative errno (EINTR: retry). Read entry i with `eventData(events, i)`.
 * @param timeoutMs -1 = forever
 */
export function epollWait(epfd: number, events: Uint8Array, timeoutMs: number): number {
  const n = libc().epoll_wait(epfd, events, Math.floor(events.byteLength / EPOLL_EVENT_SIZE), timeoutMs);
  return n < 0 ? -errno() : n;
}

/** The `data` word (low 32 bits) of event `i`, from a DataView over the buffer `epollWait` filled. */
export function eventData(events: DataView, i: number): number {
  return events.getUint32(i * EPOLL_EVENT_SIZE + 4, true);
}

/**
 * Set O_NONBLOCK on `fd`'s open file description (shared by every dup of it, in any process).
 * @throws SyscallError `fcntl`
 */
export function setNonBlocking(fd: number): void {
  const fl = libc().fcntl(fd, F_GETFL, 0);
  if (fl < 0 || libc().fcntl(fd, F_SETFL, BigInt(fl | O_NONBLOCK)) < 0) throw new SyscallError("fcntl", errno());
}

/** Address of byte `offset` of `buf`, for the calls below (compute once for a long-lived buffer). */
export function addressOf(buf: Uint8Array, offset = 0): number {
  return ptr(buf, offset);
}

/** read(2) of up to `len` bytes into address `at`: bytes read (0 = EOF) or a negative errno. */
export function readAt(fd: number, at: number, len: number): number {
  const n = Number(libc().read(fd, at as never, len));
  return n < 0 ? -errno() : n;
}

/** write(2) of `len` bytes from address `at`: bytes written or a negative errno. */
export function writeAt(fd: number, at: number, len: number): number {
  const n = Number(libc().write(fd, at as never, len));
  return n < 0 ? -errno() : n;
}

/** pread(2) of up to `len` bytes at file offset `pos` into address `at`: bytes or a negative errno. */
export function preadAt(fd: number, at: number, len: number, pos: number): number {
  const n = Number(libc().pread(fd, at as never, len, pos));
  return n < 0 ? -errno() : n;
}

/** pwrite(2) of `len` bytes from address `at` at file offset `pos`: bytes or a negative errno. */
export function pwriteAt(fd: number, at: number, len: number, pos: number): number {
  const n = Number(libc().pwrite(fd, at as never, len, pos));
  return n < 0 ? -errno() : n;
}
