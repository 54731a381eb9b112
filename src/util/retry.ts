/**
 * Trying again until something works or the time is up: for resources that appear a moment
 * after they are asked for (a device node, a socket a child process binds).
 */
import { sleep } from "./wait.ts";

/** Options of retryUntil. */
export interface RetryOptions {
  /** Tries stop once this much time passed since the first, ms (the first try always runs). */
  timeoutMs: number;
  /** Pause between tries, ms. */
  intervalMs: number;
  /** Whether a failure may pass on its own (default: every failure). Any other is thrown at once. */
  retryable?: (e: unknown) => boolean;
  /** Checked before every try after the first: false stops the tries (the awaited thing is gone). */
  alive?: () => boolean;
}

/**
 * Call `attempt` until it returns; `attempt` gets the ms left of the budget.
 * @throws the failure `retryable` refused, or the last failure once the time ran out or `alive` said no
 */
export async function retryUntil<T>(attempt: (leftMs: number) => Promise<T> | T, o: RetryOptions): Promise<T> {
  const deadline = performance.now() + o.timeoutMs;
  for (;;) {
    try {
      return await attempt(Math.max(0, deadline - performance.now()));
    } catch (e) {
      if (o.retryable && !o.retryable(e)) throw e;
      if (performance.now() >= deadline) throw e;
      await sleep(Math.min(o.intervalMs, deadline - performance.now()));
      if (o.alive && !o.alive()) throw e;
    }
  }
}
