/**
 * Per-key serialisation: operations on one sandbox run one after another, in arrival order;
 * different sandboxes run in parallel. Waiting is bounded: a caller that cannot get the lock
 * within `waitMs` gets `orchestrator.busy` (409, E2B's "sandbox is changing state").
 */
import { OrchestratorError } from "./errors.ts";

export class KeyedLock {
  private tails = new Map<string, Promise<void>>();
  private waiting = new Map<string, number>();

  /** @param maxWaiters bound on queued operations per key; more are refused with `orchestrator.busy`. */
  constructor(private readonly waitMs: number, private readonly maxWaiters: number) {}

  /** Number of keys with an operation running or queued. */
  get size(): number {
    return this.tails.size;
  }

  /**
   * Run `fn` holding the lock of `key`.
   * @throws OrchestratorError `orchestrator.busy` when the wait exceeds `waitMs` or the queue is full.
   */
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const queued = this.waiting.get(key) ?? 0;
    if (queued >= this.maxWaiters) {
      throw new OrchestratorError("orchestrator.busy", `sandbox ${key} has too many operations queued`, { sandboxId: key, queued });
    }
    const prev = this.tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const tail = prev.then(() => mine);
    this.tails.set(key, tail);
    this.waiting.set(key, queued + 1);
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      const timedOut = await Promise.race([
        prev.then(() => false),
        new Promise<boolean>((r) => (timer = setTimeout(() => r(true), this.waitMs))),
      ]);
      if (timedOut) {
        // keep the chain intact: release our slot as soon as the predecessor finishes
        void prev.then(() => {
          release();
          if (this.tails.get(key) === tail) this.tails.delete(key);
        });
        throw new OrchestratorError("orchestrator.busy", `sandbox ${key} is changing state, try again`, { sandboxId: key, waitMs: this.waitMs });
      }
    } finally {
      clearTimeout(timer);
      const n = (this.waiting.get(key) ?? 1) - 1;
      if (n <= 0) this.waiting.delete(key);
      else this.waiting.set(key, n);
    }
    try {
      return await fn();
    } finally {
      release();
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }
}
