/**
 * Processes held by a pidfd (pidfd_open(2), Linux 5.3+) that need not be children of this one: a
 * VMM or disk daemon a previous node started and this node adopts.
 *  - `holdProcess(pid, startTime)` opens the pidfd and proves it names the process whose start
 *    time (/proc/<pid>/stat field 22) was recorded: the pidfd pins that process, so a start time
 *    that still matches after the open means no pid reuse can slip in between.
 *  - `signal` goes through pidfd_send_signal(2) (Linux 5.1+): never to a process that merely
 *    reuses the pid.
 *  - `exited` resolves when the process has exited (its pidfd polls readable, POLLIN). The exit
 *    code of a process that is not our child cannot be read (waitid(P_PIDFD) needs a child).
 * One thread watches every held process (./pidfd-watch-worker.ts: epoll_wait over the pidfds,
 * each added EPOLLONESHOT with a token of its own), started with the first watch and stopped,
 * through an eventfd, when none is left: thousands of adopted processes cost one thread.
 * Syscall numbers (x86_64): pidfd_open 434, pidfd_send_signal 424. EPOLLONESHOT 1 << 30
 * (include/uapi/linux/eventpoll.h); ESRCH 3.
 */
import { closeSync } from "node:fs";
import { constants } from "node:os";
import { Worker } from "node:worker_threads";
import { workerEntry } from "../bundle.ts";
import { EPOLLIN, epollAdd, epollCreate, epollDel } from "./epoll.ts";
import { createEventfd, signalEventfd } from "./eventfd.ts";
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";
import { processStartTime } from "./proc.ts";

const SYS_pidfd_open = 434;
const SYS_pidfd_send_signal = 424;
const EPOLLONESHOT = 1 << 30;
const ESRCH = 3;
/** Token of the wake eventfd in the watcher's epoll set (process tokens start at 1). */
export const WAKE_TOKEN = 0;

/** One watcher thread and its epoll set; replaced by a fresh one after it stops. */
class Generation {
  readonly epfd: number;
  readonly wake: number;
  readonly worker: Worker;
  readonly waiting = new Map<number, { pidfd: number; resolve: () => void }>();
  stopped = false;

  constructor(onEmpty: (g: Generation) => void) {
    this.epfd = epollCreate();
    try {
      this.wake = createEventfd({ nonBlocking: true });
    } catch (e) {
      closeSync(this.epfd);
      throw e;
    }
    const r = epollAdd(this.epfd, this.wake, EPOLLIN, WAKE_TOKEN);
    if (r < 0) {
      closeSync(this.epfd);
      closeSync(this.wake);
      throw new SyscallError("epoll_ctl", -r);
    }
    // referenced: like a child process, a watched process keeps the event loop alive
    this.worker = new Worker(workerEntry("ffi/pidfd-watch-worker.ts"), { workerData: { epfd: this.epfd } });
    this.worker.on("message", (token: number) => {
      const w = this.waiting.get(token);
      if (!w) return; // unwatched meanwhile
      this.waiting.delete(token);
      epollDel(this.epfd, w.pidfd);
      w.resolve();
      onEmpty(this);
    });
    this.worker.once("exit", () => {
      closeSync(this.epfd);
      closeSync(this.wake);
    });
  }

  /** Ask the thread to end (it closes nothing itself: the fds go at its exit). */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    signalEventfd(this.wake);
  }
}

let current: Generation | undefined;
let nextToken = 1;

function stopIfIdle(g: Generation): void {
  if (g.waiting.size > 0) return;
  g.stop();
  if (current === g) current = undefined;
}

/**
 * Resolve when the process of `pidfd` exits. `cancel()` stops watching (the promise then never
 * resolves); the caller keeps owning the pidfd and closes it after cancelling or after the exit.
 * @throws SyscallError `epoll_ctl`, `epoll_create1`, `eventfd`
 */
export function watchPidfd(pidfd: number): { exited: Promise<void>; cancel(): void } {
  const g = (current ??= new Generation(stopIfIdle));
  const token = nextToken++;
  if (nextToken > 0xffffffff) nextToken = 1;
  let resolve!: () => void;
  const exited = new Promise<void>((r) => (resolve = r));
  g.waiting.set(token, { pidfd, resolve });
  const r = epollAdd(g.epfd, pidfd, EPOLLIN | EPOLLONESHOT, token);
  if (r < 0) {
    g.waiting.delete(token);
    stopIfIdle(g);
    throw new SyscallError("epoll_ctl", -r);
  }
  return {
    exited,
    cancel: () => {
      if (!g.waiting.delete(token)) return;
      epollDel(g.epfd, pidfd);
      stopIfIdle(g);
    },
  };
}

/** A process held by a pidfd (see the module comment). Call `release()` when done with it. */
export class HeldProcess {
  #pidfd: number;
  #watch: { exited: Promise<void>; cancel(): void } | undefined;
  #gone = false;
  /** Resolves when the process has exited (at once for one that was a zombie already). */
  readonly exited: Promise<void>;

  /** @internal use `holdProcess` */
  constructor(
    readonly pid: number,
    readonly startTime: number,
    pidfd: number,
  ) {
    this.#pidfd = pidfd;
    this.#watch = watchPidfd(pidfd);
    this.exited = this.#watch.exited.then(() => {
      this.#gone = true;
    });
  }

  /** True once `exited` resolved. */
  get gone(): boolean {
    return this.#gone;
  }

  /**
   * Send `sig` with pidfd_send_signal(2).
   * @returns false when the process has exited (a zombie too) or the handle was released
   * @throws SyscallError `pidfd_send_signal` for other errors (EPERM)
   */
  signal(sig: NodeJS.Signals | number): boolean {
    if (this.#pidfd < 0 || this.#gone) return false;
    const signo = typeof sig === "number" ? sig : constants.signals[sig];
    const r = Number(libc().syscall(SYS_pidfd_send_signal, this.#pidfd, signo, 0, 0, 0, 0));
    if (r === 0) return true;
    const e = errno();
    if (e === ESRCH) return false;
    throw new SyscallError("pidfd_send_signal", e);
  }

  /** Stop watching and close the pidfd (idempotent); `exited` no longer resolves unless it has. */
  release(): void {
    if (this.#pidfd < 0) return;
    this.#watch?.cancel();
    this.#watch = undefined;
    closeSync(this.#pidfd);
    this.#pidfd = -1;
  }
}

/**
 * Hold process `pid` if it is the one that started at `startTime` (clock ticks since boot).
 * @returns the held process, or null when no process has that pid or another process has it now
 * @throws SyscallError `pidfd_open` for errors other than ESRCH (EMFILE), epoll set-up errors
 */
export function holdProcess(pid: number, startTime: number): HeldProcess | null {
  if (!Number.isSafeInteger(pid) || pid <= 0) return null;
  const pidfd = Number(libc().syscall(SYS_pidfd_open, pid, 0, 0, 0, 0, 0));
  if (pidfd < 0) {
    const e = errno();
    if (e === ESRCH) return null;
    throw new SyscallError("pidfd_open", e);
  }
  if (processStartTime(pid) !== startTime) {
    closeSync(pidfd);
    return null;
  }
  try {
    return new HeldProcess(pid, startTime, pidfd);
  } catch (e) {
    closeSync(pidfd);
    throw e;
  }
}
