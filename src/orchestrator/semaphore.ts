/**
 * A counting semaphore with a bounded wait: at most `limit` holders; callers wait in FIFO
 * order until `signal` aborts.
 */
export class Semaphore {
  private held = 0;
  private queue: (() => void)[] = [];

  constructor(private readonly limit: number) {}

  /** Holders right now. */
  get inUse(): number {
    return this.held;
  }

  /** Acquire one unit; the returned function releases it (call exactly once). */
  async acquire(signal: AbortSignal): Promise<() => void> {
    if (this.held < this.limit) {
      this.held++;
      return this.releaser();
    }
    await new Promise<void>((resolve, reject) => {
      const grant = () => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      };
      const onAbort = () => {
        this.queue = this.queue.filter((g) => g !== grant);
        reject(signal.reason);
      };
      if (signal.aborted) return reject(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
      this.queue.push(grant);
    });
    return this.releaser();
  }

  private releaser(): () => void {
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const next = this.queue.shift();
      if (next) next(); // the unit passes straight to the next waiter
      else this.held--;
    };
  }
}
