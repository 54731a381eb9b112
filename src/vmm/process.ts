/**
 * A VMM process as the drivers' VM handles see it, whether this node spawned it (a child: its
 * exit code is known) or adopted it from a previous node (held by a pidfd, ../ffi/pidfd-watch.ts:
 * not a child, so its exit code is not).
 */
import type { ChildProcess } from "node:child_process";
import type { Subprocess } from "bun";
import type { HeldProcess } from "../ffi/pidfd-watch.ts";

/** One VMM process. */
export interface VmmProcess {
  readonly pid: number;
  /** Resolves once the process has exited: its exit code, or null (killed by a signal, or not our child). */
  readonly exited: Promise<number | null>;
  /** False once the process has exited. */
  readonly running: boolean;
  /** Send `sig`; nothing when the process is gone. */
  kill(sig: NodeJS.Signals): void;
  /**
   * Stop following the process without ending it (the node hands its VMM to the next node): it
   * no longer keeps this node's event loop alive; an adopted one's pidfd is closed and `exited`
   * no longer settles.
   */
  release(): void;
}

/** A child spawned with node:child_process (QEMU). */
export function childVmm(child: ChildProcess, pid: number): VmmProcess {
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return {
    pid,
    exited,
    get running() {
      return child.exitCode === null && child.signalCode === null;
    },
    kill: (sig) => void child.kill(sig),
    release: () => void child.unref(),
  };
}

/** A child spawned with Bun.spawn (Firecracker). */
export function bunVmm(proc: Subprocess<any, any, any>): VmmProcess {
  return {
    pid: proc.pid,
    exited: proc.exited.then(() => (proc.signalCode ? null : proc.exitCode)),
    get running() {
      return proc.exitCode === null && proc.signalCode === null;
    },
    kill: (sig) => void proc.kill(sig),
    release: () => void proc.unref(),
  };
}

/** A VMM adopted from a previous node; the pidfd is released once it exited. */
export function heldVmm(held: HeldProcess): VmmProcess {
  const exited = held.exited.then(() => {
    held.release();
    return null;
  });
  return {
    pid: held.pid,
    exited,
    get running() {
      return !held.gone;
    },
    kill: (sig) => void held.signal(sig),
    release: () => held.release(),
  };
}
