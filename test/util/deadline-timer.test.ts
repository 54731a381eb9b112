// One timer for many deadlines (src/util/deadline-timer.ts), on a clock the test moves: it fires
// at the earliest time armed and never before, re-arms where `run` says, keeps a deadline armed
// during a run for after it, survives a failing run, and fires nothing once stopped.
import { expect, test } from "bun:test";
import { DeadlineTimer } from "../../src/util/deadline-timer.ts";
import { FakeClock } from "../helpers/clock.ts";

function timer(clock: FakeClock, next: (now: number) => number | null | Promise<number | null>) {
  const runs: number[] = [];
  const errors: unknown[] = [];
  const t = new DeadlineTimer(
    () => {
      runs.push(clock.now());
      return next(clock.now());
    },
    (e) => errors.push(e),
    clock,
  );
  return { t, runs, errors };
}

test("fires once at the earliest deadline armed, then where run says; later arms do not move it", async () => {
  const clock = new FakeClock(1000);
  const deadlines = [1500, 2600];
  const { t, runs } = timer(clock, () => deadlines.shift() ?? null);
  t.armAt(2000);
  t.armAt(1200); // earlier: moves the timer
  t.armAt(1900); // later than 1200: no change
  expect(t.armedAt).toBe(1200);
  expect(clock.pending).toEqual([1200]);
  clock.advance(199);
  expect(runs).toEqual([]);
  clock.advance(1);
  await t.idle();
  expect(runs).toEqual([1200]);
  expect(t.armedAt).toBe(1500);
  clock.advance(10_000);
  await t.idle();
  // run is async: the 2600 it answered at 1500 is set after the step, and due at once
  expect(t.armedAt).toBe(2600);
  clock.advance(0);
  await t.idle();
  // then run says null: unset (2000 was superseded by the earlier firing)
  expect(runs).toEqual([1200, 1500, 11_200]);
  expect(t.armedAt).toBe(null);
  expect(clock.pending).toEqual([]);
});

test("a deadline armed while run is running is honoured after it, not during it", async () => {
  const clock = new FakeClock(0);
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let first = true;
  const { t, runs } = timer(clock, async () => {
    if (first) {
      first = false;
      await gate;
    }
    return null;
  });
  t.armAt(10);
  clock.advance(10);
  expect(runs).toEqual([10]);
  t.armAt(20); // while the first run waits
  expect(clock.pending).toEqual([]);
  clock.advance(50);
  expect(runs).toEqual([10]);
  release();
  await t.idle();
  expect(t.armedAt).toBe(20);
  // already past 20: fires at once
  clock.advance(0);
  await t.idle();
  expect(runs).toEqual([10, 60]);
});

test("a failing run is reported and leaves the timer unset until armed again; stop() fires nothing after", async () => {
  const clock = new FakeClock(0);
  const { t, runs, errors } = timer(clock, () => {
    throw new Error("boom");
  });
  t.armAt(5);
  clock.advance(5);
  await t.idle();
  expect(errors.map((e) => (e as Error).message)).toEqual(["boom"]);
  expect(t.armedAt).toBe(null);
  t.armAt(8);
  await t.stop();
  clock.advance(100);
  t.armAt(200);
  clock.advance(500);
  expect(runs).toEqual([5]);
  expect(clock.pending).toEqual([]);
});
