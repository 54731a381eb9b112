/**
 * A clock a test moves (src/util/deadline-timer.ts `Clock`): `now()` stands still until
 * `advance(ms)` moves it, firing the timers that fall due on the way, in time order (a timer a
 * callback sets is fired too when it falls within the step). No real time passes.
 */
import type { Clock } from "../../src/util/deadline-timer.ts";

interface Pending {
  at: number;
  seq: number;
  fn: () => void;
}

/** See the module comment. */
export class FakeClock implements Clock {
  #timers = new Map<number, Pending>();
  #seq = 0;
  constructor(public t = 1_000_000) {}

  now(): number {
    return this.t;
  }

  set(fn: () => void, ms: number): unknown {
    const seq = ++this.#seq;
    this.#timers.set(seq, { at: this.t + Math.max(0, ms), seq, fn });
    return seq;
  }

  clear(handle: unknown): void {
    this.#timers.delete(handle as number);
  }

  /** Times (absolute) of the timers set and not fired, soonest first. */
  get pending(): number[] {
    return [...this.#timers.values()].map((p) => p.at).sort((a, b) => a - b);
  }

  /** Move time forward by `ms`, firing every timer due by then (each at its own time). */
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      const due = [...this.#timers.values()].filter((p) => p.at <= end).sort((a, b) => a.at - b.at || a.seq - b.seq)[0];
      if (!due) break;
      this.#timers.delete(due.seq);
      this.t = Math.max(this.t, due.at);
      due.fn();
    }
    this.t = end;
  }
}
