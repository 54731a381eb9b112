/**
 * A lock for long builds (guest kernel, tools drive, base template) so two processes on one host
 * never build the same thing at once (e.g. `scripts/start.sh` and `scripts/test.sh`), on flock(2)
 * (src/ffi/flock.ts): the kernel drops the lock when its holder dies (kill -9 included), so a dead
 * holder's lock is free at once. A waiter blocks in the kernel rather than polling: util-linux
 * flock(1) takes the lock, with its `-w` bound, on a descriptor it shares with this process (flock
 * locks belong to the open file description, so the lock stays here when flock(1) exits). The
 * holder writes its pid into the file for waiters to name; the file itself is never removed (a
 * removed file would let a second process lock a new one while the first holds the old).
 */
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { tryFlockExclusive } from "../ffi/flock.ts";
import { VmmError } from "./errors.ts";

/** The pid a lock file names, or null (none written yet, or not a pid). */
function holderPid(lockPath: string): number | null {
  try {
    const pid = Number(readFileSync(lockPath, "utf8").trim());
    return Number.isSafeInteger(pid) && pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

/**
 * Wait (at most `timeoutMs`) for the lock at `lockPath` in flock(1).
 * @returns a function that releases it.
 * @throws VmmError `vmm.build_locked` when it stays held past `timeoutMs` (details.pid: its holder
 *   when known) or flock(1) cannot run (details.reason).
 */
async function waitForLock(lockPath: string, timeoutMs: number): Promise<() => void> {
  const fd = openSync(lockPath, "a+"); // close-on-exec: only flock(1) gets it, as its fd 3
  let ok = false;
  try {
    let code: number;
    try {
      const p = Bun.spawn(["flock", "--exclusive", "--wait", String(timeoutMs / 1000), "3"], { stdio: ["ignore", "ignore", "pipe", fd] });
      const [stderr, exit] = await Promise.all([new Response(p.stderr).text(), p.exited]);
      code = exit;
      if (code !== 0 && code !== 1) throw new Error(`flock exited ${code}: ${stderr.trim()}`);
    } catch (e) {
      throw new VmmError("vmm.build_locked", `cannot wait for ${lockPath}: ${e instanceof Error ? e.message : String(e)}`, { lockPath, reason: e instanceof Error ? e.message : String(e) });
    }
    if (code === 1) {
      const pid = holderPid(lockPath);
      throw new VmmError("vmm.build_locked", `${lockPath} held by pid ${pid ?? "unknown"} for over ${timeoutMs} ms`, { lockPath, pid });
    }
    ok = true;
    return () => closeSync(fd); // the last descriptor of the description: the lock goes with it
  } finally {
    if (!ok) closeSync(fd);
  }
}

/**
 * Run `fn` holding the lock at `lockPath`.
 * @param onWait called once when another process holds the lock, with its pid (null when it has
 *   not written it yet)
 * @throws VmmError `vmm.build_locked` when the lock stays held past `timeoutMs`
 */
export async function withBuildLock<T>(lockPath: string, timeoutMs: number, fn: () => Promise<T>, onWait?: (pid: number | null) => void): Promise<T> {
  mkdirSync(dirname(lockPath), { recursive: true });
  const held = tryFlockExclusive(lockPath);
  let release: () => void;
  if (held) release = () => held.release();
  else {
    onWait?.(holderPid(lockPath));
    release = await waitForLock(lockPath, timeoutMs);
  }
  try {
    writeFileSync(lockPath, `${process.pid}\n`); // another descriptor: the lock stays where it is
    return await fn();
  } finally {
    writeFileSync(lockPath, "");
    release();
  }
}
