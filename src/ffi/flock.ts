/**
 * Advisory whole-file locks with flock(2) on a descriptor opened here with O_CLOEXEC, so the
 * lock belongs to this process alone (children that exec do not inherit it) and the kernel drops
 * it when the process dies, kill -9 included. Values from include/uapi/asm-generic/fcntl.h and
 * include/uapi/asm-generic/errno-base.h (x86-64/arm64): O_RDWR 02, O_CREAT 0100, O_CLOEXEC
 * 02000000; LOCK_EX 2, LOCK_NB 4, LOCK_UN 8; EWOULDBLOCK = EAGAIN 11, EINTR 4.
 */
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc } from "./libc.ts";

const O_RDWR = 0o2;
const O_CREAT = 0o100;
const O_CLOEXEC = 0o2000000;
const LOCK_EX = 2;
const LOCK_NB = 4;
const EWOULDBLOCK = 11;
const EINTR = 4;



/** A failed open(2)/flock(2); `errno` is the raw number, `path` the lock file. */
export class FlockError extends AgentEnvError<FfiCodes<"flock">> {
  constructor(
    readonly call: string,
    readonly path: string,
    readonly errno: number,
  ) {
    super("flock.failed", `${call}(${path}) failed: errno ${errno}`, { call, path, errno });
  }
}

/** A held lock: `fd` stays open until `release()` (idempotent). */
export interface HeldFlock {
  fd: number;
  path: string;
  release(): void;
}

/**
 * Open (creating, mode 0644) `path` and take an exclusive, non-blocking flock on it.
 * @returns the held lock, or null when another open file description holds it (EWOULDBLOCK).
 * @throws FlockError for any other open/flock failure (missing directory, EACCES, ...).
 */
export function tryFlockExclusive(path: string): HeldFlock | null {
  const fd = libc().open(Buffer.from(path + "\0"), O_RDWR | O_CREAT | O_CLOEXEC, 0o644);
  if (fd < 0) throw new FlockError("open", path, errno());
  for (;;) {
    if (libc().flock(fd, LOCK_EX | LOCK_NB) === 0) break;
    const e = errno();
    if (e === EINTR) continue;
    libc().close(fd);
    if (e === EWOULDBLOCK) return null;
    throw new FlockError("flock", path, e);
  }
  let open = true;
  return {
    fd,
    path,
    release() {
      if (!open) return;
      open = false;
      libc().close(fd); // closing the only descriptor of the description drops the lock
    },
  };
}
