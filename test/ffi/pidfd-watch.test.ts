// holdProcess / HeldProcess (src/ffi/pidfd-watch.ts): processes that are not our children, held
// by a pidfd, one watcher thread for all of them. Real processes; order only, no wall-clock bounds.
import { expect, test } from "bun:test";
import { holdProcess } from "../../src/ffi/pidfd-watch.ts";
import { processStartTime } from "../../src/ffi/proc.ts";
import { exited, stateOf as state } from "../helpers/proc.ts";

/** A process that is not our child (its parent, `sh`, exits at once): `sleep secs`. */
async function orphanSleep(secs: number): Promise<number> {
  const sh = Bun.spawn(["sh", "-c", `sleep ${secs} >/dev/null 2>&1 & echo $!`], { stdout: "pipe" });
  const pid = Number((await new Response(sh.stdout).text()).trim());
  await sh.exited;
  expect(pid).toBeGreaterThan(0);
  return pid;
}

test("three held orphans: each exit is reported on its own, in the order they die, and signals go through the pidfd", async () => {
  const pids = [await orphanSleep(60), await orphanSleep(60), await orphanSleep(60)];
  const held = pids.map((p) => holdProcess(p, processStartTime(p)!)!);
  try {
    expect(held.every((h) => h !== null)).toBe(true);
    const order: number[] = [];
    held.forEach((h, i) => void h.exited.then(() => order.push(i)));
    expect(held[1]!.signal("SIGKILL")).toBe(true);
    await held[1]!.exited;
    expect(order).toEqual([1]);
    expect(held[1]!.gone).toBe(true);
    expect(held[0]!.gone).toBe(false);
    expect(state(pids[0]!)).toMatch(/^[RS]$/);
    // a signal to a process that has exited reports false
    expect(held[1]!.signal("SIGKILL")).toBe(false);
    process.kill(pids[2]!, "SIGTERM"); // from outside: the watch sees it all the same
    await held[2]!.exited;
    expect(held[0]!.signal(15)).toBe(true);
    await held[0]!.exited;
    expect(order).toEqual([1, 2, 0]);
    for (const p of pids) expect(exited(p)).toBe(true);
  } finally {
    for (const h of held) h?.release();
    for (const p of pids) if (!exited(p)) process.kill(p, "SIGKILL");
  }
});

test("a recorded start time that does not match, or a pid nobody has: null; a released hold signals nothing", async () => {
  const pid = await orphanSleep(60);
  try {
    const start = processStartTime(pid)!;
    expect(holdProcess(pid, start + 1)).toBeNull();
    expect(holdProcess(0, 0)).toBeNull();
    expect(holdProcess(-5, 0)).toBeNull();
    expect(holdProcess(2 ** 22 + 1, 0)).toBeNull(); // above pid_max: no such process
    const h = holdProcess(pid, start)!;
    let resolved = false;
    void h.exited.then(() => (resolved = true));
    h.release();
    h.release();
    expect(h.signal("SIGKILL")).toBe(false);
    process.kill(pid, "SIGKILL");
    // a fresh hold of another process still gets its exit: the watcher thread was restarted
    const other = await orphanSleep(60);
    const h2 = holdProcess(other, processStartTime(other)!)!;
    h2.signal("SIGKILL");
    await h2.exited;
    h2.release();
    expect(resolved).toBe(false);
  } finally {
    if (!exited(pid)) process.kill(pid, "SIGKILL");
  }
});
