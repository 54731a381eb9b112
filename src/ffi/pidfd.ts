/**
 * Process file descriptors (pidfd_open(2), Linux 5.3+):
 *  - `takeFd` copies an open file from another process into this one with pidfd_getfd(2)
 *    (Linux 5.6+; needs PTRACE_MODE_ATTACH_REALCREDS over the target: root, or the same uid
 *    without a Yama restriction). The copy shares the target's open file description (offset,
 *    flags, and for /dev/fuse the connection), like dup(2), and is close-on-exec. The disk daemon
 *    uses it to hand FUSE connections between itself and the node, so that the process that did
 *    not crash keeps every mount alive.
 *  - `waitExit` waits for any process to exit (not only a child, which waitpid needs): a pidfd
 *    polls readable (POLLIN) once its process has exited.
 * Syscall numbers (x86_64): pidfd_open 434, pidfd_getfd 438. poll(2): struct pollfd is
 * { int fd @0; short events @4; short revents @6 }, 8 bytes; POLLIN 0x1 (include/uapi/asm-generic/poll.h);
 * ESRCH 3, EINTR 4.
 */
import { closeSync } from "node:fs";
import { Worker } from "node:worker_threads";
import { workerEntry } from "../bundle.ts";
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";
import { processStartTime } from "./proc.ts";

const SYS_pidfd_open = 434;
const SYS_pidfd_getfd = 438;
const POLLIN = 0x1;
const ESRCH = 3;
const EINTR = 4;

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

/**
 * poll(2) `fd` for POLLIN for at most `timeoutMs` (0: look, do not wait), retrying after EINTR.
 * Blocks the calling thread.
 * @returns 1 when readable (or POLLERR/POLLHUP), 0 at the timeout, or a negative errno
 */
export function pollReadable(fd: number, timeoutMs: number): number {
  const pfd = new Uint8Array(8);
  const v = new DataView(pfd.buffer);
  v.setInt32(0, fd, true);
  v.setInt16(4, POLLIN, true);
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const n = libc().poll(pfd, 1, Math.max(0, Math.ceil(deadline - performance.now())));
    if (n >= 0) return n > 0 ? 1 : 0;
    const e = errno();
    if (e !== EINTR) return -e;
  }
}

/**
 * Wait until process `pid` has exited, for at most `timeoutMs`: pidfd_open(2), then poll(2) on
 * the pidfd. The blocking poll runs in a worker thread of its own (./pidfd-wait-worker.ts) that
 * ends with it, so the caller's event loop goes on meanwhile; a process that is already gone
 * answers at once without one. A zombie (exited, not yet reaped) counts as exited.
 * @param startTime the process's start time (/proc/<pid>/stat field 22, `processStartTime`) when
 *   known: a pid that now names another process counts as exited
 * @returns true when the process has exited (or never existed), false at the timeout
 * @throws SyscallError `pidfd_open` (other than ESRCH), `poll`
 */
export async function waitExit(pid: number, timeoutMs: number, startTime?: number): Promise<boolean> {
  const pidfd = Number(libc().syscall(SYS_pidfd_open, pid, 0, 0, 0, 0, 0));
  if (pidfd < 0) {
    const e = errno();
    if (e === ESRCH) return true;
    throw new SyscallError("pidfd_open", e);
  }
  try {
    // the pidfd pins the process it was opened for: a start time that differs now means the one
    // asked about is gone and its pid reused
    if (startTime !== undefined && processStartTime(pid) !== startTime) return true;
    let r = pollReadable(pidfd, 0);
    if (r === 0 && timeoutMs > 0) r = await pollInWorker(pidfd, timeoutMs);
    if (r < 0) throw new SyscallError("poll", -r);
    return r === 1;
  } finally {
    closeSync(pidfd);
  }
}

/** `pollReadable(fd, timeoutMs)` in a worker thread, which always posts one answer and ends. */
async function pollInWorker(fd: number, timeoutMs: number): Promise<number> {
  const w = new Worker(workerEntry("ffi/pidfd-wait-worker.ts"), { workerData: { fd, timeoutMs } });
  try {
    return await new Promise<number>((resolve, reject) => {
      w.once("message", (r: number) => resolve(r));
      w.once("error", reject);
    });
  } finally {
    await w.terminate();
  }
}
