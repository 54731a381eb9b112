/**
 * Waiting for something to happen, bounded: a sleep that an abort cuts short, and a wake-up that
 * any number of waiters share (a condition: each `wait` ends at the next `notify` or its bound).
 */

/** Resolves after `ms`, or at once when `signal` aborts (it never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, ms));
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * A wake-up for waiters of a state that changes: `wait` resolves at the next `notify` (every
 * waiter at once) or when its bound passes, whichever comes first. Waiters then re-read the state.
 */
export class Notifier {
  readonly #wakes = new Set<() => void>();

  /** Waiters now. */
  get waiting(): number {
    return this.#wakes.size;
  }

  /** Resolves at the next `notify()`, or after `timeoutMs` (default: no bound). Never rejects. */
  wait(timeoutMs = Infinity): Promise<void> {
    return new Promise<void>((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#wakes.delete(wake);
        resolve();
      };
      const timer = Number.isFinite(timeoutMs) ? setTimeout(wake, Math.max(0, timeoutMs)) : undefined;
      this.#wakes.add(wake);
    });
  }

  /** Wake every waiter. */
  notify(): void {
    for (const wake of [...this.#wakes]) wake();
  }
}
