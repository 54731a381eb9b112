/**
 * Copy an open file from another process into this one with pidfd_open(2) + pidfd_getfd(2)
 * (Linux 5.6+; needs PTRACE_MODE_ATTACH_REALCREDS over the target: root, or the same uid without
 * a Yama restriction). The copy shares the target's open file description (offset, flags,
 * and for /dev/fuse the connection), like dup(2), and is close-on-exec.
 * The disk daemon uses it to hand FUSE connections between itself and the node, so that the
 * process that did not crash keeps every mount alive.
 * Syscall numbers (x86_64): pidfd_open 434, pidfd_getfd 438.
 */
import { closeSync } from "node:fs";
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";

const SYS_pidfd_open = 434;
const SYS_pidfd_getfd = 438;

/**
 * Duplicate fd `targetFd` of process `pid` into this process.
 * @returns the new fd (close-on-exec)
 * @throws SyscallError `pidfd_open` (ESRCH: no such process) or `pidfd_getfd` (EBADF: no such
 *   fd in the target; EPERM: not allowed to trace it)
 */
export function takeFd(pid: number, targetFd: number): number {
  const pidfd = Number(libc().syscall(SYS_pidfd_open, pid, 0, 0, 0, 0, 0));
  if (pidfd < 0) throw new SyscallError("pidfd_open", errno());
  try {
    const fd = Number(libc().syscall(SYS_pidfd_getfd, pidfd, targetFd, 0, 0, 0, 0));
    if (fd < 0) throw new SyscallError("pidfd_getfd", errno());
    return fd;
  } finally {
    closeSync(pidfd);
  }
}
