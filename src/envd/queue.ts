/**
 * A bounded single-consumer event queue with back-pressure for the producer and keepalive
 * injection for the consumer. One queue per open stream (Start, Connect, WatchDir). Bounded by
 * event count and, when given a weight function, by the bytes the queued events hold.
 */

/** Why a queue stopped producing: normal end or an error to raise in the consumer. */
export type QueueEnd = { error?: unknown };

/** Bounds of one queue. */
export interface QueueBounds<T> {
  /** Events buffered before `waitForSpace()` blocks the producer (> 0). */
  highWater: number;
  /** Bytes buffered (sum of `weigh`) before `waitForSpace()` blocks; default: no byte bound. */
  highWaterBytes?: number;
  /** Bytes an event holds (e.g. its payload length). */
  weigh?: (item: T) => number;
}

/** FIFO of events for one subscriber. */
export class EventQueue<T> {
  readonly highWater: number;
  readonly highWaterBytes: number;
  private readonly weigh: (item: T) => number;
  private items: T[] = [];
  private head = 0;
  private held = 0;
  private wakeConsumer: (() => void) | undefined;
  private spaceWaiters: (() => void)[] = [];
  private end: QueueEnd | undefined;

  /** @param bounds event count bound (a number), or count + byte bounds. */
  constructor(bounds: number | QueueBounds<T>) {
    const b = typeof bounds === "number" ? { highWater: bounds } : bounds;
    if (!(b.highWater > 0)) throw new RangeError(`highWater must be > 0, got ${b.highWater}`);
    if (b.highWaterBytes !== undefined && !(b.highWaterBytes > 0)) throw new RangeError(`highWaterBytes must be > 0, got ${b.highWaterBytes}`);
    this.highWater = b.highWater;
    this.highWaterBytes = b.highWaterBytes ?? Infinity;
    this.weigh = b.weigh ?? (() => 0);
  }

  /** Number of events not yet taken by the consumer. */
  get size(): number {
    return this.items.length - this.head;
  }

  /** Bytes held by the events not yet taken (sum of `weigh`). */
  get bytes(): number {
    return this.held;
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.end !== undefined;
  }

  /** Append an event; ignored after close. Never blocks: producers call `waitForSpace()`. */
  push(item: T): void {
    if (this.end) return;
    this.items.push(item);
    this.held += this.weigh(item);
    this.wake();
  }

  /** Resolves once the queue is under both bounds or is closed. */
  waitForSpace(): Promise<void> {
    if (this.hasSpace() || this.end) return Promise.resolve();
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
   * Take queued events in order, at least one when any is queued, then more while their total
   * weight stays within `maxBytes` and their number within `maxItems`. Returns [] when nothing
   * is queued.
   */
  take(maxBytes: number, maxItems = Infinity): T[] {
    const out: T[] = [];
    let sum = 0;
    while (this.head < this.items.length) {
      const item = this.items[this.head]!;
      const w = this.weigh(item);
      if (out.length > 0 && (sum + w > maxBytes || out.length >= maxItems)) break;
      out.push(item);
      sum += w;
      this.shift(w);
    }
    if (out.length > 0 && this.hasSpace()) this.releaseSpace();
    return out;
  }

  /**
   * Wait until events are queued ("items"), the queue is closed and drained ("end"; the close
   * error, if any, is thrown), `timeoutMs` passed without an event ("idle") or `signal`
   * aborted ("aborted").
   */
  async ready(signal: AbortSignal, timeoutMs?: number): Promise<"items" | "end" | "idle" | "aborted"> {
    for (;;) {
      if (signal.aborted) return "aborted";
      if (this.size > 0) return "items";
      if (this.end) {
        if (this.end.error !== undefined) throw this.end.error;
        return "end";
      }
      const onAbort = () => this.wake();
      signal.addEventListener("abort", onAbort);
      try {
        if (await this.waitForItem(timeoutMs)) return "idle";
      } finally {
        signal.removeEventListener("abort", onAbort);
      }
    }
  }

  /**
   * Drain the queue until it is closed or `signal` aborts. When nothing arrives for
   * `keepaliveMs`, yields `keepalive()` instead.
   */
  async *iterate(signal: AbortSignal, keepaliveMs?: number, keepalive?: () => T): AsyncGenerator<T> {
    try {
      for (;;) {
        const r = await this.ready(signal, keepaliveMs);
        if (r === "items") yield this.take(0, 1)[0]!;
        else if (r === "idle") {
          if (keepalive) yield keepalive();
        } else return;
      }
    } finally {
      // A consumer that went away must never hold its producer back.
      this.close();
    }
  }

  private hasSpace(): boolean {
    return this.size < this.highWater && this.held < this.highWaterBytes;
  }

  private shift(weight: number): void {
    this.items[this.head++] = undefined as T;
    this.held -= weight;
    if (this.head === this.items.length) {
      this.items = [];
      this.head = 0;
    } else if (this.head >= 1024 && this.head * 2 >= this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
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
