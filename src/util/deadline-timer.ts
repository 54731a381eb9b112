/**
 * One timer for many deadlines, instead of a sweep every N ms: the owner arms it at a time
 * (unix ms) and it fires once at the earliest time armed; the owner's `run` then handles what
 * expired and returns the next deadline it knows of (or null: none), and the timer re-arms
 * there. Arming earlier than the pending deadline moves the timer forward; arming later is a
 * no-op (the earlier firing re-arms from `run`'s answer). `run` never overlaps itself: a deadline
 * armed while it runs is kept and honoured after it. The clock is injectable, so a test moves
 * time instead of sleeping.
 */

/** Time and timers, as the system has them or as a test drives them. */
export interface Clock {
  /** Now, unix ms. */
  now(): number;
  /** Call `fn` once after `ms`; returns a handle for `clear`. */
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

/** The system clock: Date.now and setTimeout. */
export const SYSTEM_CLOCK: Clock = {
  now: () => Date.now(),
  set: (fn, ms) => setTimeout(fn, ms),
  clear: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
};

/** setTimeout's longest delay (a longer one fires at once). */
const MAX_DELAY_MS = 2 ** 31 - 1;

/** See the module comment. `stop()` on shutdown (it waits for a `run` in progress). */
export class DeadlineTimer {
  #handle: unknown = null;
  /** The time the timer is set for, or null when unset. */
  #at: number | null = null;
  /** Earliest deadline armed while `run` was running. */
  #pending: number | null = null;
  /** True while `run` runs (set before it is called: a deadline it arms itself is pending). */
  #busy = false;
  #running: Promise<void> | null = null;
  #stopped = false;

  /**
   * @param run handles what expired by now; returns the next deadline (unix ms) or null. A throw
   *   or rejection goes to `onError` and the timer stays unset until armed again.
   */
  constructor(
    private readonly run: () => Promise<number | null> | number | null,
    private readonly onError: (e: unknown) => void,
    private readonly clock: Clock = SYSTEM_CLOCK,
  ) {}

  /** The time the timer will fire (unix ms), or null when nothing is armed. For tests and logs. */
  get armedAt(): number | null {
    return this.#busy ? this.#pending : this.#at;
  }

  /** Make sure `run` is called at `at` (unix ms) at the latest. */
  armAt(at: number): void {
    if (this.#stopped) return;
    if (this.#busy) {
      this.#pending = this.#pending === null ? at : Math.min(this.#pending, at);
      return;
    }
    if (this.#at !== null && this.#at <= at) return;
    if (this.#handle !== null) this.clock.clear(this.#handle);
    this.#at = at;
    this.#handle = this.clock.set(() => this.#fire(), Math.min(MAX_DELAY_MS, Math.max(0, at - this.clock.now())));
  }

  /** Resolves when no `run` is in progress (for tests driving a fake clock). */
  async idle(): Promise<void> {
    while (this.#running) await this.#running;
  }

  /** Unset the timer and wait for a `run` in progress; nothing fires after. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#handle !== null) this.clock.clear(this.#handle);
    this.#handle = null;
    this.#at = null;
    await this.#running;
  }

  #fire(): void {
    this.#handle = null;
    const at = this.#at;
    this.#at = null;
    // a delay clamped to setTimeout's longest: not due yet, wait again
    if (at !== null && at > this.clock.now()) return this.armAt(at);
    this.#busy = true;
    // `finally` runs after this assignment even when `run` returns at once
    const p: Promise<void> = this.#runOnce().finally(() => {
      if (this.#running === p) this.#running = null;
    });
    this.#running = p;
  }

  async #runOnce(): Promise<void> {
    let next: number | null = null;
    try {
      next = await this.run();
    } catch (e) {
      this.onError(e);
    }
    const pending = this.#pending;
    this.#pending = null;
    this.#busy = false;
    const soonest = next === null ? pending : pending === null ? next : Math.min(next, pending);
    if (soonest !== null) this.armAt(soonest);
  }
}
