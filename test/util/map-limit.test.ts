/** mapLimit (src/util/map-limit.ts): order of results, the bound on calls in flight, failures, bad limits. */
import { expect, test } from "bun:test";
import { mapLimit } from "../../src/util/map-limit.ts";

test("results keep the input order and at most `limit` calls run at once", async () => {
  let inFlight = 0;
  let most = 0;
  const gates: (() => void)[] = [];
  const run = mapLimit([5, 4, 3, 2, 1, 0], 3, async (n, i) => {
    inFlight++;
    most = Math.max(most, inFlight);
    await new Promise<void>((r) => gates.push(r));
    inFlight--;
    return `${i}:${n * 10}`;
  });
  // release the calls one by one, newest first: completion order differs from input order
  while (gates.length > 0 || inFlight > 0) {
    await Bun.sleep(0);
    gates.pop()?.();
  }
  expect(await run).toEqual(["0:50", "1:40", "2:30", "3:20", "4:10", "5:0"]);
  expect(most).toBe(3);
});

test("an empty list gives an empty result; a limit above the count runs all at once", async () => {
  expect(await mapLimit([], 4, async () => 1)).toEqual([]);
  let most = 0;
  let inFlight = 0;
  await mapLimit([1, 2], 8, async () => {
    most = Math.max(most, ++inFlight);
    await Bun.sleep(1);
    inFlight--;
  });
  expect(most).toBe(2);
});

test("the first rejection rejects the whole and no call starts after it", async () => {
  const started: number[] = [];
  const err = await mapLimit([0, 1, 2, 3, 4], 1, async (n) => {
    started.push(n);
    if (n === 1) throw new Error("boom at 1");
    return n;
  }).catch((e: Error) => e.message);
  expect(err).toBe("boom at 1");
  expect(started).toEqual([0, 1]);
});

test("a limit that is not a positive integer is a RangeError", async () => {
  for (const bad of [0, -1, 1.5, Number.NaN]) await expect(mapLimit([1], bad, async (n) => n)).rejects.toThrow(RangeError);
});
