/**
 * Sandbox starts in progress on this node, so that background work (restore pool fills) waits
 * for a quiet moment: no start running, and none ended for a while. Waiters wake on the events
 * (a start beginning or ending) and on the end of the quiet window, never on a poll.
 */
import { pauseFor } from "./pause-for.ts";

/** Counts starts in progress and wakes waiters when that changes. */
export class StartActivity {
  #running = 0;
  /** When the last start ended (performance.now()); the process's start before any. */
  #lastEnd = 0;
  /** Aborted (and replaced) at every begin and end: what waiters wait on. */
  #changed = new AbortController();

  /** A start began; call `end` when it ends, whatever its outcome. */
  begin(): void {
    this.#running++;
    this.#wake();
  }

  /** A start ended. */
  end(): void {
    this.#running--;
    this.#lastEnd = performance.now();
    this.#wake();
  }

  /** Starts in progress now. */
  get running(): number {
    return this.#running;
  }

  /**
   * Resolves once no start has been in progress for `quietMs` (at once when none ran that
   * recently).
   * @throws `signal.reason` when `signal` aborts first
   */
  async quiet(quietMs: number, signal: AbortSignal): Promise<void> {
    for (;;) {
      if (signal.aborted) throw signal.reason;
      const left = this.#lastEnd + quietMs - performance.now();
      if (this.#running === 0 && left <= 0) return;
      const wake = AbortSignal.any([signal, this.#changed.signal]);
      // a start running: until it ends; none: until the window closes or one begins
      await (this.#running > 0 ? pauseFor(2 ** 31 - 1, wake) : pauseFor(left, wake));
    }
  }

  #wake(): void {
    const c = this.#changed;
    this.#changed = new AbortController();
    c.abort();
  }
}
