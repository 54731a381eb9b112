/**
 * pipe2(2) and splice(2) for zero-copy replies of the FUSE reader threads: file pages go into a
 * pipe by reference and from the pipe into /dev/fuse with one copy (a read(2)/write(2) pair
 * copies twice). Like ./epoll.ts, the hot-loop calls return a byte count or a negative errno and
 * never throw; `pipeCreate` throws `SyscallError`.
 * Values from include/uapi/asm-generic/fcntl.h, include/uapi/linux/fcntl.h and
 * include/linux/splice.h (x86_64): O_CLOEXEC 02000000, O_NONBLOCK 04000, F_SETPIPE_SZ 1031
 * (F_LINUX_SPECIFIC_BASE 1024 + 7), F_GETPIPE_SZ 1032, SPLICE_F_MOVE 1, SPLICE_F_NONBLOCK 2.
 * A pipe's capacity is rounded up to a power of two pages; above /proc/sys/fs/pipe-max-size
 * (1 MiB by default) it needs CAP_SYS_RESOURCE.
 */
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";

const O_CLOEXEC = 0o2000000;
const O_NONBLOCK = 0o4000;
const F_SETPIPE_SZ = 1031;
const F_GETPIPE_SZ = 1032;
/** Ask the kernel to move pages instead of copying them (a hint; copies when it cannot). */
export const SPLICE_F_MOVE = 1;
/** Do not block on the pipe. */
export const SPLICE_F_NONBLOCK = 2;

/** A pipe's two ends. */
export interface Pipe {
  readFd: number;
  writeFd: number;
}

/**
 * A non-blocking, close-on-exec pipe holding at least `capacity` bytes (0 = the default 64 KiB).
 * @throws SyscallError `pipe2`, or `fcntl` (F_SETPIPE_SZ refused, e.g. EPERM above
 *   pipe-max-size without CAP_SYS_RESOURCE); the pipe is closed first
 */
export function pipeCreate(capacity = 0): Pipe {
  const fds = new Int32Array(2);
  if (libc().pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) throw new SyscallError("pipe2", errno());
  const p = { readFd: fds[0]!, writeFd: fds[1]! };
  if (capacity > 0 && libc().fcntl(p.writeFd, F_SETPIPE_SZ, BigInt(capacity)) < 0) {
    const e = errno();
    pipeClose(p);
    throw new SyscallError("fcntl", e);
  }
  return p;
}

/** The pipe's capacity in bytes (F_GETPIPE_SZ), or a negative errno. */
export function pipeCapacity(p: Pipe): number {
  const n = libc().fcntl(p.writeFd, F_GETPIPE_SZ, 0n);
  return n < 0 ? -errno() : n;
}

/** Close both ends. */
export function pipeClose(p: Pipe): void {
  libc().close(p.readFd);
  libc().close(p.writeFd);
}

/**
 * splice(2) of up to `len` bytes from file `fd` at offset `pos` into a pipe's write end:
 * bytes moved (0 = EOF) or a negative errno. `posBuf` is a caller-owned 8-byte BigInt64Array
 * (the kernel's loff_t in/out argument; reused to avoid an allocation per call).
 */
export function spliceFromFile(fd: number, pos: number, pipeWrite: number, len: number, posBuf: BigInt64Array): number {
  posBuf[0] = BigInt(pos);
  const n = Number(libc().splice(fd, posBuf, pipeWrite, null, len, SPLICE_F_MOVE | SPLICE_F_NONBLOCK));
  return n < 0 ? -errno() : n;
}

/** splice(2) of exactly the next `len` bytes of a pipe into `fd` (a stream, e.g. /dev/fuse): bytes or a negative errno. */
export function spliceToFd(pipeRead: number, fd: number, len: number): number {
  const n = Number(libc().splice(pipeRead, null, fd, null, len, SPLICE_F_NONBLOCK));
  return n < 0 ? -errno() : n;
}
