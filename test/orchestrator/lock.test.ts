import { expect, test } from "bun:test";
import { KeyedLock } from "../../src/orchestrator/lock.ts";
import { Semaphore } from "../../src/orchestrator/semaphore.ts";
import { OrchestratorError } from "../../src/orchestrator/errors.ts";
import { waitFor } from "../helpers/wait.ts";

test("operations on one key run one at a time in arrival order; other keys run in parallel", async () => {
  const lock = new KeyedLock(5_000, 10);
  const log: string[] = [];
  const op = (key: string, name: string, ms: number) =>
    lock.run(key, async () => {
      log.push(`start ${name}`);
      await Bun.sleep(ms);
      log.push(`end ${name}`);
      return name;
    });
  const results = await Promise.all([op("a", "a1", 40), op("a", "a2", 10), op("b", "b1", 5), op("a", "a3", 1)]);
  expect(results).toEqual(["a1", "a2", "b1", "a3"]);
  // b1 ran while a1 held key a; a2 and a3 waited for their predecessors
  expect(log.indexOf("end b1")).toBeLessThan(log.indexOf("end a1"));
  expect(log.filter((l) => l.includes(" a"))).toEqual(["start a1", "end a1", "start a2", "end a2", "start a3", "end a3"]);
  expect(lock.size).toBe(0);
});

test("a failing operation releases the lock for the next one", async () => {
  const lock = new KeyedLock(5_000, 10);
  const first = lock.run("k", async () => {
    throw new Error("boom");
  });
  await expect(first).rejects.toThrow("boom");
  expect(await lock.run("k", async () => 7)).toBe(7);
});

test("waiting longer than waitMs is orchestrator.busy (409) and keeps the chain intact", async () => {
  const lock = new KeyedLock(30, 10);
  const slow = lock.run("k", () => Bun.sleep(120).then(() => "slow"));
  let err: unknown;
  try {
    await lock.run("k", async () => "never");
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(OrchestratorError);
  expect((err as OrchestratorError).code).toBe("orchestrator.busy");
  expect(await slow).toBe("slow");
  expect(await lock.run("k", async () => "after")).toBe("after");
  // the timed-out caller's slot is released behind the others
  await waitFor("every key released", () => lock.size === 0);
});

test("the per-key queue is bounded", async () => {
  const lock = new KeyedLock(5_000, 2);
  let holding!: () => void;
  let release!: () => void;
  const held = new Promise<void>((r) => (holding = r));
  const hold = lock.run("k", () => {
    holding();
    return new Promise<void>((r) => (release = r));
  });
  await held; // the holder has the lock now; it is not a waiter
  const q1 = lock.run("k", async () => 1);
  const q2 = lock.run("k", async () => 2);
  await expect(lock.run("k", async () => 3)).rejects.toMatchObject({ code: "orchestrator.busy" });
  release();
  await hold;
  expect(await Promise.all([q1, q2])).toEqual([1, 2]);
});

test("semaphore admits at most `limit` holders, FIFO, and abandons waiters on abort", async () => {
  const sem = new Semaphore(2);
  const never = new AbortController().signal;
  const r1 = await sem.acquire(never);
  const r2 = await sem.acquire(never);
  expect(sem.inUse).toBe(2);
  const order: number[] = [];
  const w3 = sem.acquire(never).then((r) => (order.push(3), r));
  const ac = new AbortController();
  const w4 = sem.acquire(ac.signal);
  const w5 = sem.acquire(never).then((r) => (order.push(5), r));
  ac.abort(new Error("gave up"));
  await expect(w4).rejects.toThrow("gave up");
  r1();
  r1(); // a second call is ignored
  const r3 = await w3;
  expect(sem.inUse).toBe(2);
  r2();
  const r5 = await w5;
  expect(order).toEqual([3, 5]);
  r3();
  r5();
  expect(sem.inUse).toBe(0);
});
