// waitExit (src/ffi/pidfd.ts): waiting for any process to exit with pidfd_open + poll, in a
// thread of its own so the event loop runs on. Real processes; no wall-clock bounds: order only.
import { expect, test } from "bun:test";
import { waitExit } from "../../src/ffi/pidfd.ts";
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

test("a process that is not our child: the wait ends when it exits, and timers run meanwhile", async () => {
  const pid = await orphanSleep(30);
  expect(state(pid)).toMatch(/^[RS]$/);
  const order: string[] = [];
  const waited = waitExit(pid, 60_000).then((r) => (order.push(`exited ${r}`), r));
  // the event loop runs while the wait blocks in its thread; the process lives on
  await new Promise((r) => setTimeout(r, 50));
  order.push("timer");
  expect(state(pid)).toMatch(/^[RS]$/);
  process.kill(pid, "SIGTERM");
  expect(await waited).toBe(true);
  expect(order).toEqual(["timer", "exited true"]);
  expect(exited(pid)).toBe(true);
});

test("a process that outlives the timeout: false, still running; after SIGKILL: true", async () => {
  const pid = await orphanSleep(30);
  const start = processStartTime(pid)!;
  expect(await waitExit(pid, 100, start)).toBe(false);
  expect(state(pid)).toMatch(/^[RS]$/);
  expect(await waitExit(pid, 0)).toBe(false); // a look without waiting
  process.kill(pid, "SIGKILL");
  expect(await waitExit(pid, 60_000, start)).toBe(true);
  expect(exited(pid)).toBe(true);
});

test("a pid that names no process, or another process than the start time says: exited at once", async () => {
  const child = Bun.spawn(["true"]);
  await child.exited;
  expect(await waitExit(child.pid, 60_000)).toBe(true);
  const pid = await orphanSleep(30);
  try {
    // the start time of another process: the one asked about is gone (its pid reused)
    expect(await waitExit(pid, 60_000, processStartTime(pid)! + 1)).toBe(true);
    expect(state(pid)).toMatch(/^[RS]$/);
  } finally {
    process.kill(pid, "SIGKILL");
  }
});
