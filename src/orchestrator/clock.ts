/**
 * The orchestrator's time: wall-clock ms for records and deadlines, and timers armed against
 * it. Injectable, so a test can move time on and see which timers are armed without waiting.
 */

/** Longest single wait of a timer, ms (setTimeout's limit, 2^31 - 1: about 24.8 days). */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** Wall-clock time and timers. */
export interface Clock {
  /** Unix ms. */
  now(): number;
  /**
   * Run `fn` once after `ms` (0 or less: as soon as possible, never synchronously).
   * @returns a function that cancels it (no-op once it ran)
   */
  after(ms: number, fn: () => void): () => void;
}

/** The system clock: `Date.now()` and `setTimeout`, waits beyond MAX_TIMER_MS taken in steps. */
export const systemClock: Clock = {
  now: () => Date.now(),
  after(ms, fn) {
    let t: ReturnType<typeof setTimeout>;
    const arm = (left: number) => {
      t = setTimeout(() => (left > MAX_TIMER_MS ? arm(left - MAX_TIMER_MS) : fn()), Math.max(0, Math.min(left, MAX_TIMER_MS)));
    };
    arm(ms);
    return () => clearTimeout(t);
  },
};
