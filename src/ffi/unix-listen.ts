/**
 * A listening AF_UNIX stream socket made here and handed to a child process, which accepts on
 * it: a client may connect as soon as this returns (the kernel queues the connection in the
 * backlog until the child accepts), so nobody polls for the child to create its socket.
 * QEMU takes such a socket as `-chardev socket,fd=N,server=on` (qemu-options.hx: "fd=h ... an
 * already opened and listening socket").
 * Values from include/linux/socket.h and include/linux/net.h (x86-64/arm64): AF_UNIX 1,
 * SOCK_STREAM 1, SOCK_CLOEXEC 02000000; struct sockaddr_un (include/uapi/linux/un.h) is a 2-byte
 * family followed by a 108-byte NUL-terminated path.
 */
import { ptr } from "bun:ffi";
import { closeSync, rmSync } from "node:fs";
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";

const AF_UNIX = 1;
const SOCK_STREAM = 1;
const SOCK_CLOEXEC = 0o2000000;
/** sizeof(struct sockaddr_un): sa_family_t sun_family (2) + char sun_path[108]. */
const SOCKADDR_UN_BYTES = 110;
const SUN_FAMILY_OFFSET = 0;
const SUN_PATH_OFFSET = 2;
/** include/uapi/asm-generic/errno-base.h, errno.h */
const EINVAL = 22;
const ENAMETOOLONG = 36;
/** Longest path sun_path holds (107 bytes and its NUL). */
export const UNIX_PATH_MAX = 107;

/**
 * Create a close-on-exec stream socket listening at `path` (an existing file there is replaced)
 * with room for `backlog` unaccepted connections. The caller owns the descriptor: pass it to the
 * child (which gets a copy without close-on-exec) and close it with `fs.closeSync` once spawned.
 * @throws SyscallError `unix_listen.path` with errno 36 (ENAMETOOLONG) when the path is longer
 *   than `UNIX_PATH_MAX` bytes or 22 (EINVAL) when it holds a NUL byte, else `socket`, `bind` or
 *   `listen` with the errno.
 */
export function listenUnix(path: string, backlog = 4): number {
  const bytes = Buffer.from(path, "utf8");
  if (bytes.includes(0)) throw new SyscallError("unix_listen.path", EINVAL);
  if (bytes.byteLength > UNIX_PATH_MAX) throw new SyscallError("unix_listen.path", ENAMETOOLONG);
  const addr = Buffer.alloc(SOCKADDR_UN_BYTES);
  addr.writeUInt16LE(AF_UNIX, SUN_FAMILY_OFFSET);
  bytes.copy(addr, SUN_PATH_OFFSET);
  rmSync(path, { force: true });
  const fd = libc().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw new SyscallError("socket", errno());
  try {
    if (libc().bind(fd, ptr(addr), SUN_PATH_OFFSET + bytes.byteLength + 1) !== 0) throw new SyscallError("bind", errno());
    if (libc().listen(fd, backlog) !== 0) throw new SyscallError("listen", errno());
    return fd;
  } catch (err) {
    closeSync(fd);
    rmSync(path, { force: true });
    throw err;
  }
}
