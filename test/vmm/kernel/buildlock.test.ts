/** The build lock used by `kernel build` and `template build-base`. */
import { expect, test } from "bun:test";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { withBuildLock } from "../../../src/vmm/buildlock.ts";
import { processStartTime } from "../../../src/vmm/supervise.ts";

test("builds are serialized, stale locks are taken over, a live holder times out the waiter", async () => {
  const d = mkdtempSync(join(tmpdir(), "c1lock-"));
  const lock = join(d, "sub", ".build.lock");
  const holder = spawn("sleep", ["60"], { stdio: "ignore" });
  try {
    const events: string[] = [];
    const job = (n: string) => async () => {
      events.push(`${n}-start`);
      expect(existsSync(lock)).toBe(true);
      await Bun.sleep(150);
      events.push(`${n}-end`);
      return n;
    };
    const waits: number[] = [];
    const [a, b] = await Promise.all([withBuildLock(lock, 10_000, job("a")), withBuildLock(lock, 10_000, job("b"), (pid) => waits.push(pid))]);
    expect([a, b]).toEqual(["a", "b"]);
    expect(events).toEqual(["a-start", "a-end", "b-start", "b-end"]);
    expect(waits[0]).toBe(process.pid);
    expect(existsSync(lock)).toBe(false);

    // stale: the recorded process is gone (dead pid) or the pid was reused (other start time)
    writeFileSync(lock, JSON.stringify({ pid: 999_999_999, startTime: 1 }));
    expect(await withBuildLock(lock, 1000, async () => "took-over")).toBe("took-over");
    writeFileSync(lock, JSON.stringify({ pid: holder.pid, startTime: processStartTime(holder.pid!)! + 1 }));
    expect(await withBuildLock(lock, 1000, async () => "reused-pid")).toBe("reused-pid");
    writeFileSync(lock, "garbage");
    expect(await withBuildLock(lock, 1000, async () => "garbage")).toBe("garbage");

    // live holder: the waiter gives up with vmm.build_locked and never runs fn
    writeFileSync(lock, JSON.stringify({ pid: holder.pid, startTime: processStartTime(holder.pid!) }));
    let ran = false;
    await expect(withBuildLock(lock, 1200, async () => (ran = true))).rejects.toMatchObject({ code: "vmm.build_locked", details: { pid: holder.pid } });
    expect(ran).toBe(false);
    expect(existsSync(lock)).toBe(true); // not ours to remove
  } finally {
    holder.kill("SIGKILL");
    rmSync(d, { recursive: true, force: true });
  }
}, 30_000);
