import { expect, test } from "bun:test";
import { retryUntil } from "../../src/util/retry.ts";

const fail = (code: string) => Object.assign(new Error(code), { code });

test("retryUntil tries again on a retryable failure and returns the first success", async () => {
  let tries = 0;
  const v = await retryUntil(
    () => {
      if (++tries < 3) throw fail("ENOENT");
      return "opened";
    },
    { timeoutMs: 60_000, intervalMs: 1, retryable: (e) => (e as { code?: string }).code === "ENOENT" },
  );
  expect(v).toBe("opened");
  expect(tries).toBe(3);
});

test("a failure it may not retry is thrown after one try", async () => {
  let tries = 0;
  const e = await retryUntil(
    () => {
      tries++;
      throw fail("EACCES");
    },
    { timeoutMs: 60_000, intervalMs: 1, retryable: (x) => (x as { code?: string }).code === "ENOENT" },
  ).catch((x: unknown) => x);
  expect((e as { code: string }).code).toBe("EACCES");
  expect(tries).toBe(1);
});

test("once the time is up the last failure is thrown; a zero budget still tries once", async () => {
  let tries = 0;
  const e = await retryUntil(() => {
    throw fail(`try ${++tries}`);
  }, { timeoutMs: 0, intervalMs: 1 }).catch((x: unknown) => x);
  expect(tries).toBe(1);
  expect((e as Error).message).toBe("try 1");
});

test("alive false stops the tries with the last failure", async () => {
  let tries = 0;
  let alive = true;
  const e = await retryUntil(
    () => {
      tries++;
      if (tries === 2) alive = false;
      throw fail(`try ${tries}`);
    },
    { timeoutMs: 60_000, intervalMs: 1, alive: () => alive },
  ).catch((x: unknown) => x);
  expect(tries).toBe(2);
  expect((e as Error).message).toBe("try 2");
});
