/**
 * Taking over a VMM a previous node left running (issue 27): prove from its record that the
 * process alive under the recorded pid is that VMM, and hold it by a pidfd. The proof: the pid
 * has the recorded start time (/proc/<pid>/stat field 22, checked after the pidfd is open, so the
 * pidfd pins the right process) and its command line (/proc/<pid>/cmdline) ends with the
 * recorded arguments, which name the sandbox id and its sockets. The driver's `attach` then
 * reconnects the control socket and the console (./qemu/attach.ts, ./firecracker/driver.ts).
 */
import { readFileSync } from "node:fs";
import { holdProcess, type HeldProcess } from "../ffi/pidfd-watch.ts";
import { processStartTime } from "../ffi/proc.ts";
import { logger } from "../observability/log.ts";
import type { VmmRecord } from "./supervise.ts";
import type { VmHandle, VmmAttachResult, VmmLostReason } from "./types.ts";
import { orLate } from "../util/timeout.ts";

const log = logger("vmm.adopt");

/** The arguments of process `pid` (/proc/<pid>/cmdline split on NUL), or null when unreadable. */
export function processArgv(pid: number): string[] | null {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    if (raw === "") return null; // a zombie or kernel thread
    return raw.replace(/\0$/, "").split("\0");
  } catch {
    return null;
  }
}

/** True when `actual` ends with `expected.slice(1)` (the arguments; argv[0] may differ). */
export function argvMatches(actual: readonly string[], expected: readonly string[]): boolean {
  const args = expected.slice(1);
  if (args.length === 0 || actual.length < args.length) return false;
  const off = actual.length - args.length;
  return args.every((a, i) => actual[off + i] === a);
}

/** A lost result, logged. */
export function lost(id: string, reason: VmmLostReason, detail: string): VmmAttachResult & { kind: "lost" } {
  log.warn({ id, reason, detail }, "VMM not adopted");
  return { kind: "lost", id, reason, detail };
}

/**
 * Hold the process `rec` names if it is that VMM (see the module comment).
 * @param need record fields the driver needs: missing ones make the record invalid (its VMM, if
 *   proved ours by pid and start time, is killed: nobody could drive it)
 * @returns the held process, or why not (`gone`, `other_process`, `record_invalid`)
 */
export async function holdRecorded(rec: VmmRecord, driver: VmmRecord["driver"], need: (keyof VmmRecord)[], killTimeoutMs: number): Promise<{ proc: HeldProcess } | (VmmAttachResult & { kind: "lost" })> {
  const proc = holdProcess(rec.pid, rec.startTime);
  if (!proc) {
    const now = processStartTime(rec.pid);
    return now === null
      ? lost(rec.id, "gone", `no process ${rec.pid}`)
      : lost(rec.id, "other_process", `process ${rec.pid} started at tick ${now}, the recorded VMM at ${rec.startTime}`);
  }
  const argv = processArgv(rec.pid);
  if (argv === null) {
    proc.release();
    return lost(rec.id, "gone", `process ${rec.pid} has exited`);
  }
  if (rec.argv && !argvMatches(argv, rec.argv)) {
    proc.release();
    return lost(rec.id, "other_process", `process ${rec.pid} runs ${JSON.stringify(argv.slice(0, 4))}..., not the recorded VMM`);
  }
  const missing = need.filter((k) => rec[k] === undefined);
  const why = rec.driver !== driver
    ? `recorded for driver ${rec.driver}, this node runs ${driver}`
    : missing.length > 0
      ? `record lacks ${missing.join(", ")} (written by an older node)`
      : !rec.argv!.includes(rec.id) && !rec.argv!.some((a) => a.endsWith(`-${rec.id}`))
        ? `recorded command line does not name sandbox ${rec.id}`
        : null;
  if (why) {
    await killHeld(proc, killTimeoutMs);
    return lost(rec.id, "record_invalid", why);
  }
  return { proc };
}

/**
 * SIGKILL a held process and wait (at most `timeoutMs`) for its exit; then release the pidfd.
 * @returns true when it exited
 */
export async function killHeld(proc: HeldProcess, timeoutMs: number): Promise<boolean> {
  proc.signal("SIGKILL");
  const done = await orLate(proc.exited.then(() => true), timeoutMs, false);
  proc.release();
  return done;
}
