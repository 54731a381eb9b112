import { expect, test } from "bun:test";
import { orLate, withTimeout } from "../../src/util/timeout.ts";

const never = new Promise<never>(() => {});

test("withTimeout passes a value or a rejection through, and rejects with its own error when late", async () => {
  expect(await withTimeout(Promise.resolve(7), 1000, () => new Error("late"))).toBe(7);
  await expect(withTimeout(Promise.reject(new RangeError("own")), 1000, () => new Error("late"))).rejects.toThrow(RangeError);
  const err = await withTimeout(never, 1, () => new TypeError("too slow")).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(TypeError);
  expect((err as Error).message).toBe("too slow");
});

test("orLate answers the value, or the late marker when time runs out first; a negative bound is late at once", async () => {
  expect(await orLate(Promise.resolve("done"), 1000, "late")).toBe("done");
  expect(await orLate(never, 1, "late")).toBe("late");
  expect(await orLate(never, -5, false)).toBe(false);
  await expect(orLate(Promise.reject(new Error("failed")), 1000, "late")).rejects.toThrow("failed");
});

test("a settled wait leaves no timer behind: the bound's callback never runs", async () => {
  let made = 0;
  await withTimeout(Promise.resolve(1), 5, () => {
    made++;
    return new Error("late");
  });
  await orLate(never, 20, "late"); // time for a leaked 5 ms timer to fire
  expect(made).toBe(0);
});
