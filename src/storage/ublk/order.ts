/**
 * The order in which the main thread answers the requests the queue threads forward for one
 * device: reads start at once; writes, discards and flushes run one after another in arrival
 * order (a flush covers every write before it); an exclusive operation (e.g. a restack of the
 * overlaybd stack under a live device) runs after every request already started and holds the
 * ones that arrive meanwhile until it ends. Plain promises, no kernel: unit-tested on its own.
 */
export class RequestOrder {
  #chain: Promise<unknown> = Promise.resolve();
  /** Requests started or held, until they settle (their buffers are in use until then). */
  #pending = new Set<Promise<unknown>>();
  /** While an exclusive operation runs: resolves when it ended. */
  #gate: Promise<void> | null = null;

  /** Requests started or held and not yet settled. */
  get pending(): number {
    return this.#pending.size;
  }

  /**
   * Start one request: `start` runs now, or once the exclusive operation running now ended. The
   * promise it returns is tracked until it settles (see `idle`).
   */
  admit(start: () => Promise<unknown>): void {
    const gate = this.#gate;
    const p: Promise<unknown> = gate ? gate.then(start) : start();
    const tracked = p.catch(() => {}).finally(() => this.#pending.delete(tracked));
    this.#pending.add(tracked);
  }

  /** Run `fn` after every serial operation before it (writes, discards, flushes, exclusive operations). */
  serial<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.#chain.then(fn);
    this.#chain = p.catch(() => {});
    return p;
  }

  /**
   * Run `op` while no other request runs: it starts once the requests started before it have
   * settled (reads too: they may read what `op` changes), and requests admitted meanwhile start
   * after it ended, whether it succeeded or threw.
   * @returns what `op` returns; its error is rethrown
   */
  exclusive<T>(op: () => Promise<T>): Promise<T> {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const before = [...this.#pending];
    const prev = this.#gate;
    this.#gate = prev ? prev.then(() => gate) : gate;
    const mine = this.#gate;
    return this.serial(async () => {
      try {
        await Promise.all(before);
        return await op();
      } finally {
        if (this.#gate === mine) this.#gate = null;
        release();
      }
    });
  }

  /** Resolves once every request admitted so far, and every serial operation, has settled. */
  async idle(): Promise<void> {
    while (this.#pending.size > 0) await Promise.all([...this.#pending]);
    await this.#chain;
  }
}
