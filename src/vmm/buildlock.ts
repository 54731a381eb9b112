/**
 * A lock file for long builds (guest kernel, base template) so two processes on one host never
 * build the same thing at once (e.g. `scripts/start.sh` and `scripts/test.sh`). The file holds the
 * owner's pid and start time; a lock whose owner is gone is taken over. The waiter polls once per
 * second up to `timeoutMs`. (Two waiters that find the same stale lock in the same instant can
 * both take it over; that window is a few microseconds and only costs a duplicate build.)
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { VmmError } from "./errors.ts";
import { processStartTime } from "./supervise.ts";

/**
 * Run `fn` holding the lock at `lockPath`.
 * @param onWait called once per poll while another live process holds the lock, with its pid
 * @throws VmmError `vmm.build_locked` when the lock stays held past `timeoutMs`
 */
export async function withBuildLock<T>(lockPath: string, timeoutMs: number, fn: () => Promise<T>, onWait?: (pid: number) => void): Promise<T> {
  mkdirSync(dirname(lockPath), { recursive: true });
  const me = JSON.stringify({ pid: process.pid, startTime: processStartTime(process.pid) });
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      writeFileSync(lockPath, me, { flag: "wx" });
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
    }
    let holder: { pid: number; startTime: number } | null = null;
    try {
      holder = JSON.parse(readFileSync(lockPath, "utf8"));
    } catch {
      // unreadable or half-written: treated as stale below
    }
    if (!holder || processStartTime(holder.pid) !== holder.startTime) {
      rmSync(lockPath, { force: true });
      continue;
    }
    if (Date.now() > deadline) throw new VmmError("vmm.build_locked", `${lockPath} held by pid ${holder.pid} for over ${timeoutMs} ms`, { lockPath, pid: holder.pid });
    onWait?.(holder.pid);
    await Bun.sleep(1000);
  }
  try {
    return await fn();
  } finally {
    rmSync(lockPath, { force: true });
  }
}
