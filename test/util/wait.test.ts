import { expect, test } from "bun:test";
import { Notifier, sleep } from "../../src/util/wait.ts";

test("sleep ends at once when its signal aborts, and at once for an aborted signal", async () => {
  const ctl = new AbortController();
  const order: string[] = [];
  const slept = sleep(60_000, ctl.signal).then(() => order.push("slept"));
  await Promise.resolve();
  order.push("abort");
  ctl.abort();
  await slept;
  expect(order).toEqual(["abort", "slept"]);
  await sleep(60_000, ctl.signal); // already aborted: returns
  await sleep(1);
});

test("notify wakes every waiter at once; a wait with a bound ends by itself", async () => {
  const n = new Notifier();
  const woke: number[] = [];
  const a = n.wait().then(() => woke.push(1));
  const b = n.wait(60_000).then(() => woke.push(2));
  expect(n.waiting).toBe(2);
  n.notify();
  await Promise.all([a, b]);
  expect(woke.sort()).toEqual([1, 2]);
  expect(n.waiting).toBe(0);
  await n.wait(1); // nobody notifies: the bound ends it
  expect(n.waiting).toBe(0);
});
