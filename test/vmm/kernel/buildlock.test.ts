/**
 * The build lock used by `kernel build`, the tools drive and `template build-base`
 * (src/vmm/buildlock.ts, on flock): builds are serialized and a waiter names the holder; a
 * holder killed with SIGKILL frees the lock at once (the kernel drops it); a live holder makes
 * the waiter give up with vmm.build_locked after its bound, without running the build. The
 * other holders are real processes locking the file with util-linux flock(1).
 */
import { expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { withBuildLock } from "../../../src/vmm/buildlock.ts";
import { waitEvent, waitFor } from "../../helpers/wait.ts";

/** Whether another process could take the lock now. */
const free = (lock: string) => Bun.spawnSync(["flock", "--nonblock", lock, "true"]).exitCode === 0;

/** A process (its pid = the one spawned) holding the lock at `lock` and naming itself in it. */
async function holder(lock: string): Promise<Bun.Subprocess> {
  const p = Bun.spawn(["sh", "-c", 'exec 3>>"$1"; flock --exclusive 3; echo $$ > "$1"; exec sleep 60', "sh", lock], { stdio: ["ignore", "ignore", "inherit"] });
  await waitFor("the holder to take the lock", () => readFileSync(lock, "utf8").trim() === String(p.pid), { retryErrors: true });
  return p;
}

test("builds are serialized and the waiter names the holder; the file stays, unlocked and empty, after", async () => {
  const d = mkdtempSync(join(tmpdir(), "c1lock-"));
  const lock = join(d, "sub", ".build.lock");
  try {
    const events: string[] = [];
    let waited!: (pid: number | null) => void;
    const bWaits = new Promise<number | null>((r) => (waited = r));
    const a = withBuildLock(lock, 10_000, async () => {
      events.push("a-start");
      expect(free(lock)).toBe(false);
      // hold the lock until b is waiting for it
      expect(await waitEvent("b to wait", bWaits)).toBe(process.pid);
      events.push("a-end");
      return "a";
    });
    const b = withBuildLock(lock, 10_000, async () => {
      events.push("b-start");
      expect(readFileSync(lock, "utf8")).toBe(`${process.pid}\n`);
      events.push("b-end");
      return "b";
    }, waited);
    expect(await Promise.all([a, b])).toEqual(["a", "b"]);
    expect(events).toEqual(["a-start", "a-end", "b-start", "b-end"]);
    expect([existsSync(lock), free(lock), readFileSync(lock, "utf8")]).toEqual([true, true, ""]);
  } finally {
    rmSync(d, { recursive: true, force: true });
  }
}, 30_000);

test("a live holder times the waiter out (vmm.build_locked naming it, the build never runs); killed, its lock is free", async () => {
  const d = mkdtempSync(join(tmpdir(), "c1lock-"));
  const lock = join(d, ".build.lock");
  const h = await holder(lock);
  let h2: Bun.Subprocess | undefined;
  try {
    const waits: (number | null)[] = [];
    let ran = false;
    await expect(withBuildLock(lock, 300, async () => (ran = true), (pid) => waits.push(pid))).rejects.toMatchObject({ code: "vmm.build_locked", details: { pid: h.pid } });
    expect([ran, waits]).toEqual([false, [h.pid]]);
    // a dead holder's lock is free: the kernel drops it with the process
    h.kill("SIGKILL");
    await h.exited;
    expect(await withBuildLock(lock, 10_000, async () => "after-kill")).toBe("after-kill");
    // a waiter blocked when the holder dies gets the lock then, not at its bound
    h2 = await holder(lock);
    const got = withBuildLock(lock, 60_000, async () => "woken");
    await waitFor("the waiter's flock(1) to block", () => Bun.spawnSync(["pgrep", "-f", `^flock --exclusive --wait 60 3$`]).exitCode === 0);
    h2.kill("SIGKILL");
    expect(await waitEvent("the waiter to take the lock", got, 10_000)).toBe("woken");
  } finally {
    h.kill("SIGKILL");
    h2?.kill("SIGKILL");
    rmSync(d, { recursive: true, force: true });
  }
}, 30_000);
