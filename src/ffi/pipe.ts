/**
 * pipe2(2) through libc via bun:ffi, for process output: Bun.spawn's "pipe" stdio is a unix
 * socketpair, whose writes allocate socket buffers per write; a pipe moves the same bytes with a
 * plain copy into its ring and, enlarged with F_SETPIPE_SZ, lets a fast writer hand over up to
 * that much before it blocks (what E2B's envd gives its children: Go's os.Pipe).
 * Values from include/uapi/asm-generic/fcntl.h and include/uapi/linux/fcntl.h.
 */
import { ptr } from "bun:ffi";
import { closeSync } from "node:fs";
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";

const O_CLOEXEC = 0o2000000;
const O_NONBLOCK = 0o4000;
const F_GETFL = 3;
const F_SETFL = 4;
const F_SETPIPE_SZ = 1031; // F_LINUX_SPECIFIC_BASE (1024) + 7

/** Both ends of a pipe; the caller owns them and closes them with `fs.closeSync`. */
export interface PipeEnds {
  /** Read end, non-blocking (Bun polls it). */
  read: number;
  /** Write end, blocking (for a child's stdout/stderr). */
  write: number;
  /** Capacity the kernel gave the pipe, bytes (its default, 64 KiB, when enlarging was refused). */
  capacity: number;
}

/**
 * A close-on-exec pipe whose read end is non-blocking, enlarged to `capacity` bytes when the
 * kernel allows it (up to /proc/sys/fs/pipe-max-size for unprivileged callers; the kernel rounds
 * up to a power of two pages).
 * @throws SyscallError `pipe2` (EMFILE, ENFILE) or `fcntl`.
 */
export function createPipe(capacity: number): PipeEnds {
  const fds = new Int32Array(2);
  if (libc().pipe2(ptr(fds), O_CLOEXEC) !== 0) throw new SyscallError("pipe2", errno());
  const [read, write] = [fds[0]!, fds[1]!];
  try {
    const fl = libc().fcntl(read, F_GETFL, 0);
    if (fl < 0 || libc().fcntl(read, F_SETFL, BigInt(fl | O_NONBLOCK)) < 0) throw new SyscallError("fcntl", errno());
    const got = libc().fcntl(read, F_SETPIPE_SZ, BigInt(capacity));
    return { read, write, capacity: got > 0 ? got : 65536 };
  } catch (err) {
    closeSync(read);
    closeSync(write);
    throw err;
  }
}
