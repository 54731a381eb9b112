/**
 * The quiet wait of the node's sandbox starts (src/sandbox/start-activity.ts), which restore pool
 * fills wait on: it ends only once no start runs and none ended within the window, wakes on the
 * events themselves, and ends with the signal. Orders of events, never times.
 */
import { expect, test } from "bun:test";
import { StartActivity } from "../../src/sandbox/start-activity.ts";

const never = new AbortController().signal;

test("no start ran within the window: quiet at once", async () => {
  const a = new StartActivity();
  await a.quiet(0, never);
  expect(a.running).toBe(0);
});

test("a start in progress holds the wait until it ends; so does one that begins inside the window", async () => {
  const a = new StartActivity();
  const order: string[] = [];
  a.begin();
  a.begin();
  const q = a.quiet(30, never).then(() => order.push("quiet"));
  await Bun.sleep(40); // longer than the window: only the running starts hold the wait
  order.push("end 1");
  a.end();
  await Bun.sleep(40);
  order.push("end 2");
  a.end();
  // a start inside the window after the last end: the window starts again at its end
  a.begin();
  order.push("begin 3");
  await Bun.sleep(40);
  order.push("end 3");
  a.end();
  await q;
  expect(order).toEqual(["end 1", "end 2", "begin 3", "end 3", "quiet"]);
  expect(a.running).toBe(0);
});

test("the signal ends the wait with its reason", async () => {
  const a = new StartActivity();
  a.begin();
  const stop = new AbortController();
  const q = a.quiet(0, stop.signal);
  stop.abort(new Error("pool closed"));
  await expect(q).rejects.toThrow("pool closed");
  await expect(a.quiet(0, stop.signal)).rejects.toThrow("pool closed");
  a.end();
  await a.quiet(0, never);
});
