/**
 * eventfd(2): a counter file descriptor one thread signals (write of a u64) and another waits on
 * (a read returns the counter and resets it). Used as a doorbell into a thread blocked in
 * io_uring_enter (an IORING_OP_READ armed on it completes) and to learn of io_uring completions
 * from the event loop (IORING_REGISTER_EVENTFD + an async read). EFD_CLOEXEC = O_CLOEXEC
 * 0o2000000 (include/uapi/linux/eventfd.h via fcntl.h).
 */
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";
import { closeSync, writeSync } from "node:fs";

const EFD_CLOEXEC = 0o2000000;


/** A failed eventfd call; `errno` is the raw number. */
export class EventfdError extends SyscallError {}

/**
 * A new blocking eventfd (close-on-exec) with counter 0.
 * @throws EventfdError (EMFILE, ENFILE)
 */
export function createEventfd(): number {
  const fd = libc().eventfd(0, EFD_CLOEXEC);
  if (fd < 0) throw new EventfdError("eventfd", errno());
  return fd;
}

const ONE = new Uint8Array([1, 0, 0, 0, 0, 0, 0, 0]);

/** Add 1 to the counter (wakes a reader). Never blocks in practice (the counter would have to reach 2^64-1). */
export function signalEventfd(fd: number): void {
  writeSync(fd, ONE, 0, 8);
}

/** Close an eventfd. */
export function closeEventfd(fd: number): void {
  closeSync(fd);
}
