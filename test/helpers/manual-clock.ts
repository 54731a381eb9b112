/**
 * A clock for tests that moves only when told (`advance`): the orchestrator's record times and
 * deadlines read it, and its timers run when time is moved past them, so a test sees exactly
 * which timers are armed (`armed()`) without waiting.
 */
import type { Clock } from "../../src/orchestrator/index.ts";

interface Timer {
  at: number;
  fn: () => void;
}

export class ManualClock implements Clock {
  #now: number;
  readonly #timers = new Set<Timer>();

  constructor(start = Date.UTC(2026, 0, 1)) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  after(ms: number, fn: () => void): () => void {
    const t = { at: this.#now + Math.max(0, ms), fn };
    this.#timers.add(t);
    return () => this.#timers.delete(t);
  }

  /** When the armed timers are due (unix ms), soonest first. */
  armed(): number[] {
    return [...this.#timers].map((t) => t.at).sort((a, b) => a - b);
  }

  /** Move time on by `ms` (0: run what is due now), running every timer due by then, soonest first. */
  advance(ms: number): void {
    const to = this.#now + ms;
    for (;;) {
      const next = [...this.#timers].filter((t) => t.at <= to).sort((a, b) => a.at - b.at)[0];
      if (!next) break;
      this.#timers.delete(next);
      this.#now = Math.max(this.#now, next.at);
      next.fn();
    }
    this.#now = to;
  }
}
