/**
 * eventfd(2): a counter file descriptor one thread signals (write of a u64) and another waits on
 * (a read returns the counter and resets it). Used as a doorbell into a thread blocked in
 * io_uring_enter (an IORING_OP_READ armed on it completes), to learn of io_uring completions
 * from the event loop (IORING_REGISTER_EVENTFD + an async read), and, non-blocking, to wake a
 * thread parked in epoll_wait (the FUSE reader pool). EFD_CLOEXEC = O_CLOEXEC 0o2000000,
 * EFD_NONBLOCK = O_NONBLOCK 0o4000 (include/uapi/linux/eventfd.h via fcntl.h).
 * Safe in any thread: each thread that imports this opens its own libc binding, errno is per thread.
 */
import { closeSync } from "node:fs";
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";

const EFD_CLOEXEC = 0o2000000;
const EFD_NONBLOCK = 0o4000;

/** A failed eventfd call; `errno` is the raw number. */
export class EventfdError extends SyscallError {}

/**
 * A new close-on-exec eventfd with counter 0; blocking unless `nonBlocking` (then a read of a
 * zero counter fails with EAGAIN instead of waiting).
 * @throws EventfdError (EMFILE, ENFILE)
 */
export function createEventfd(opts: { nonBlocking?: boolean } = {}): number {
  const fd = libc().eventfd(0, EFD_CLOEXEC | (opts.nonBlocking ? EFD_NONBLOCK : 0));
  if (fd < 0) throw new EventfdError("eventfd", errno());
  return fd;
}

const one = new BigUint64Array([1n]);
const sink = new BigUint64Array(1);

/**
 * Add 1 to the counter (wakes its readers and watchers); no exception and no allocation, for hot
 * paths. Never blocks in practice (the counter would have to reach 2^64-1).
 * @returns 0, or a negative errno
 */
export function signalEventfd(fd: number): number {
  return Number(libc().write(fd, one, 8)) < 0 ? -errno() : 0;
}

/** Reset the counter to 0. @returns 0, or a negative errno (EAGAIN: a non-blocking eventfd was already 0) */
export function drainEventfd(fd: number): number {
  return Number(libc().read(fd, sink, 8)) < 0 ? -errno() : 0;
}

/** Close an eventfd. */
export function closeEventfd(fd: number): void {
  closeSync(fd);
}
