/**
 * The disk daemon as a process seen from the node: one this node spawned (a child: its exit code
 * is known) or one a previous node left and this node adopted (held by a pidfd,
 * ../../ffi/pidfd-watch.ts), plus the helpers that find a daemon left on a directory.
 */
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import type { HeldProcess } from "../../ffi/pidfd-watch.ts";
import { waitExit } from "../../ffi/pidfd.ts";
import { processStartTime } from "../../ffi/proc.ts";
import { logger } from "../../observability/log.ts";
import { DaemonClient } from "./client.ts";
import type { DiskConfig } from "./config.ts";
import { daemonPaths } from "./daemon.ts";
import { orLate } from "../../util/timeout.ts";

const log = logger("disk");

/** A running disk daemon. */
export interface DaemonProcess {
  readonly pid: number;
  /** Resolves once it has exited. */
  readonly exited: Promise<void>;
  /** False once it has exited. */
  readonly running: boolean;
  /** Its exit code once exited; null while running, when killed by a signal, or for an adopted daemon (not our child). */
  readonly exitCode: number | null;
  /** The signal that ended it, when known. */
  readonly signalCode: string | null;
  kill(sig: NodeJS.Signals): void;
  /** Stop following it (the node hands it to the next node); it no longer keeps the event loop alive. */
  release(): void;
}

/** A daemon this node spawned with Bun.spawn. */
export function spawnedDaemon(proc: ReturnType<typeof Bun.spawn>): DaemonProcess {
  return {
    pid: proc.pid,
    exited: proc.exited.then(() => undefined),
    get running() {
      return proc.exitCode === null && proc.signalCode === null;
    },
    get exitCode() {
      return proc.exitCode;
    },
    get signalCode() {
      return proc.signalCode === null || proc.signalCode === undefined ? null : String(proc.signalCode);
    },
    kill: (sig) => void proc.kill(sig),
    release: () => proc.unref(),
  };
}

/** A daemon a previous node started, held by its pidfd (released once it exited). */
export function adoptedDaemon(held: HeldProcess): DaemonProcess {
  return {
    pid: held.pid,
    exited: held.exited.then(() => held.release()),
    get running() {
      return !held.gone;
    },
    exitCode: null,
    signalCode: null,
    kill: (sig) => void held.signal(sig),
    release: () => held.release(),
  };
}

/** Command prefix that runs this program's CLI (bun + main.ts from source, or the compiled binary). */
export function agentenvCommand(): string[] {
  const exe = process.execPath;
  if (/(^|\/)bun[^/]*$/.test(exe)) return [exe, fileURLToPath(new URL("../../cli/main.ts", import.meta.url))];
  return [exe];
}

/** The last `bytes` of the file at `path` ("" when unreadable). */
export function tail(path: string, bytes = 2000): string {
  try {
    return readFileSync(path, "utf8").slice(-bytes);
  } catch {
    return "";
  }
}

/** First line of a child's stdout, or null when it exits or `timeoutMs` passes first. */
export async function readLine(proc: ReturnType<typeof Bun.spawn>, timeoutMs: number): Promise<string | null> {
  const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
  let text = "";
  const deadline = performance.now() + timeoutMs;
  try {
    while (!text.includes("\n")) {
      const r = await orLate(reader.read(), deadline - performance.now(), "timeout");
      if (r === "timeout" || r.done) return null;
      text += new TextDecoder().decode(r.value);
    }
    return text.slice(0, text.indexOf("\n"));
  } finally {
    reader.releaseLock();
  }
}

/** The pid a daemon wrote into its lock file, if any. */
export function readPidFile(path: string): number | null {
  try {
    const pid = Number(readFileSync(path, "utf8").trim().split(" ")[0]);
    return Number.isSafeInteger(pid) && pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

/** True when `pid` runs `agentenv ublk-daemon --dir <dir>`. */
export function isDaemon(pid: number, dir: string): boolean {
  try {
    const args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    return args.includes("ublk-daemon") && args.includes(dir);
  } catch {
    return false;
  }
}

/** Wait (at most `timeoutMs`) until the process now running as `pid` has exited. */
export async function waitGone(pid: number, timeoutMs: number): Promise<void> {
  const start = processStartTime(pid);
  if (start !== null) await waitExit(pid, timeoutMs, start);
}

/**
 * Shut down (or kill) a daemon left on `dir` by a node that crashed: a `shutdown` request (it
 * removes every device it had), or SIGKILL by the pid in its lock file when it does not answer.
 */
export async function stopLeftoverDaemon(dir: string, config: DiskConfig): Promise<void> {
  const paths = daemonPaths(dir);
  if (!existsSync(paths.socket) && !existsSync(paths.lock)) return;
  try {
    const c = await DaemonClient.connect(paths.socket, { timeoutMs: config.readyTimeoutMs, maxFrameBytes: config.maxFrameBytes });
    try {
      const f = await c.request({ kind: "get_features" });
      log.warn({ pid: f.pid }, "a disk daemon from an earlier run is still up: shutting it down");
      await c.request({ kind: "shutdown" });
      await waitGone(f.pid, config.stopTimeoutMs);
    } finally {
      c.close();
    }
  } catch (e) {
    log.debug({ err: e }, "no answering disk daemon left");
  }
  const pid = readPidFile(paths.lock);
  if (pid && isDaemon(pid, dir)) {
    log.warn({ pid }, "killing an unresponsive disk daemon from an earlier run");
    process.kill(pid, "SIGKILL");
    await waitGone(pid, config.stopTimeoutMs);
  }
}
