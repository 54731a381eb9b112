/**
 * A bounded single-consumer event queue with back-pressure for the producer and keepalive
 * injection for the consumer. One queue per open stream (Start, Connect, WatchDir).
 */

/** Why a queue stopped producing: normal end or an error to raise in the consumer. */
export type QueueEnd = { error?: unknown };

/** FIFO of events for one subscriber. */
export class EventQueue<T> {
  private readonly items: T[] = [];
  private wakeConsumer: (() => void) | undefined;
  private spaceWaiters: (() => void)[] = [];
  private end: QueueEnd | undefined;

  /** @param highWater events buffered before `waitForSpace()` blocks the producer. */
  constructor(readonly highWater: number) {
    if (!(highWater > 0)) throw new RangeError(`highWater must be > 0, got ${highWater}`);
  }

  /** Number of events not yet taken by the consumer. */
  get size(): number {
    return this.items.length;
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.end !== undefined;
  }

  /** Append an event; ignored after close. Never blocks: producers call `waitForSpace()`. */
  push(item: T): void {
    if (this.end) return;
    this.items.push(item);
    this.wake();
  }

  /** Resolves once the queue holds fewer than `highWater` events or is closed. */
  waitForSpace(): Promise<void> {
    if (this.items.length < this.highWater || this.end) return Promise.resolve();
    return new Promise((r) => this.spaceWaiters.push(r));
  }

  /** No more events; queued ones are still delivered, then `error` (if any) is thrown. */
  close(error?: unknown): void {
    if (this.end) return;
    this.end = { error };
    this.wake();
    this.releaseSpace();
  }

  /**
   * Drain the queue until it is closed or `signal` aborts. When nothing arrives for
   * `keepaliveMs`, yields `keepalive()` instead.
   */
  async *iterate(signal: AbortSignal, keepaliveMs?: number, keepalive?: () => T): AsyncGenerator<T> {
    const onAbort = () => this.wake();
    signal.addEventListener("abort", onAbort);
    try {
      while (!signal.aborted) {
        if (this.items.length > 0) {
          const item = this.items.shift()!;
          if (this.items.length < this.highWater) this.releaseSpace();
          yield item;
          continue;
        }
        if (this.end) {
          if (this.end.error !== undefined) throw this.end.error;
          return;
        }
        const timedOut = await this.waitForItem(keepaliveMs);
        if (timedOut && keepalive && !signal.aborted) yield keepalive();
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
      // A consumer that went away must never hold its producer back.
      this.close();
    }
  }

  private waitForItem(timeoutMs?: number): Promise<boolean> {
    return new Promise((resolve) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      this.wakeConsumer = () => {
        if (timer) clearTimeout(timer);
        resolve(false);
      };
      if (timeoutMs !== undefined && timeoutMs > 0) {
        timer = setTimeout(() => {
          this.wakeConsumer = undefined;
          resolve(true);
        }, timeoutMs);
      }
    });
  }

  private wake(): void {
    const w = this.wakeConsumer;
    this.wakeConsumer = undefined;
    w?.();
  }

  private releaseSpace(): void {
    const ws = this.spaceWaiters;
    this.spaceWaiters = [];
    for (const w of ws) w();
  }
}
