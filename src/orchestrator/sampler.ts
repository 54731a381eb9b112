/**
 * The metrics sampler: fills each running sandbox's history (metrics.ts) from the runtime's
 * `metrics.sample` (the guest's envd), on demand. A sample costs an idle guest a wakeup and its
 * envd a request, so sandboxes nobody looks at are left alone: a sandbox whose metrics someone
 * asked for (API routes: `watch(ids, true)`) is sampled every `intervalMs` for `watchMs` after
 * the last ask; a read that finds no sample younger than `intervalMs` takes one first (bounded by
 * `timeoutMs`), so the answer is current (a Prometheus scrape freshens without watching: the
 * scrape is its own clock); every other running sandbox is sampled every `idleIntervalMs`
 * (0: never). docs/density.md has the figures and the trade-off.
 */
import type { Logger } from "pino";
import type { MetricsHistory } from "./metrics.ts";
import type { GuestTarget, RuntimeMetrics } from "./runtime.ts";
import { Semaphore } from "./semaphore.ts";

/** Settings of the sampler (`[metrics]`), ms and counts. */
export interface SamplerOptions {
  /** Period of samples of a watched sandbox, and the age under which a sample is current. */
  intervalMs: number;
  /** How long a sandbox stays watched after the last ask for its metrics. */
  watchMs: number;
  /** Period of samples of a sandbox nobody watches; 0: none. */
  idleIntervalMs: number;
  /** Bound on one sample, and on how long a read waits for fresh ones. */
  timeoutMs: number;
  /** Most samples in flight at once. */
  maxConcurrent: number;
}

/**
 * Samples the running sandboxes `targets()` names as described above. Owned by the orchestrator,
 * which starts and stops it; one tick every `intervalMs` decides who is due (host-only work).
 */
export class MetricsSampler {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private tick: Promise<void> | undefined;
  private stopped = false;
  /** Sandbox id -> until when (ms) it is watched. */
  private readonly watched = new Map<string, number>();
  /** Samples in flight, one per sandbox at most. */
  private readonly inflight = new Map<string, Promise<void>>();
  private readonly slots: Semaphore;
  /** Samples taken (successful or not) since the start, for tests and logs. */
  taken = 0;

  constructor(
    /** The runtime's metrics capability; absent: nothing is sampled. */
    private readonly runtime: RuntimeMetrics | undefined,
    private readonly history: MetricsHistory,
    /** The running sandboxes (the orchestrator's records with an endpoint). */
    private readonly targets: () => GuestTarget[],
    private readonly opts: SamplerOptions,
    private readonly now: () => number,
    private readonly log: Logger,
  ) {
    this.slots = new Semaphore(opts.maxConcurrent);
  }

  /** Start the loop (no-op when the runtime cannot sample). */
  start(): void {
    if (!this.runtime || this.stopped) return;
    this.schedule();
  }

  /** Stop the loop and wait for the samples in flight. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.tick;
    await Promise.allSettled([...this.inflight.values()]);
  }

  /**
   * Someone reads the metrics of `ids`: with `keep`, each stays watched for `watchMs` from now;
   * those running without a sample younger than `intervalMs` get one now. Resolves once those
   * samples are in, or after `timeoutMs` (the late ones still land in the history).
   */
  async watch(ids: readonly string[], keep: boolean): Promise<void> {
    if (!this.runtime || this.stopped) return;
    const t = this.now();
    const want = new Set(ids);
    if (keep) for (const id of want) this.watched.set(id, t + this.opts.watchMs);
    const stale = this.targets().filter((x) => want.has(x.id) && !this.fresh(x.id, t, this.opts.intervalMs));
    if (stale.length === 0) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([Promise.allSettled(stale.map((x) => this.sample(x))), new Promise<void>((r) => (timer = setTimeout(r, this.opts.timeoutMs)))]);
    clearTimeout(timer);
  }

  /** Forget `id` (killed): no more watching. */
  forget(id: string): void {
    this.watched.delete(id);
  }

  /** Whether `id` is watched now. */
  isWatched(id: string): boolean {
    return (this.watched.get(id) ?? 0) > this.now();
  }

  /** One tick now: sample every running sandbox that is due (the loop calls it; tests may too). */
  sampleDue(): Promise<void> {
    this.tick ??= this.doTick().finally(() => (this.tick = undefined));
    return this.tick;
  }

  private schedule(): void {
    this.timer = setTimeout(() => {
      void this.sampleDue().finally(() => {
        if (!this.stopped) this.schedule();
      });
    }, this.opts.intervalMs);
  }

  private async doTick(): Promise<void> {
    const t = this.now();
    for (const [id, until] of this.watched) if (until <= t) this.watched.delete(id);
    // a little slack: a sample taken just under one period ago is due at this tick, not the next
    const slack = Math.min(1000, this.opts.intervalMs / 4);
    const due = this.targets().filter((x) => {
      const period = this.watched.has(x.id) ? this.opts.intervalMs : this.opts.idleIntervalMs;
      return period > 0 && !this.fresh(x.id, t, period - slack);
    });
    await Promise.allSettled(due.map((x) => this.sample(x)));
  }

  /** Whether `id` has a sample taken less than `maxAgeMs` before `t`. */
  private fresh(id: string, t: number, maxAgeMs: number): boolean {
    const s = this.history.latest(id);
    return s !== undefined && t - s.at < maxAgeMs;
  }

  /** Sample `x` once (joined when one is in flight already), at most `maxConcurrent` at a time. */
  private sample(x: GuestTarget): Promise<void> {
    const have = this.inflight.get(x.id);
    if (have) return have;
    const p = (async () => {
      const release = await this.slots.acquire(AbortSignal.timeout(this.opts.timeoutMs * 4));
      try {
        this.taken++;
        const s = await this.runtime!.sample(x, AbortSignal.timeout(this.opts.timeoutMs));
        this.history.add(x.id, { ...s, at: this.now() });
      } finally {
        release();
      }
    })()
      .catch((e) => {
        // a sandbox being paused or killed right now, a busy guest, or a full queue: next time
        this.log.debug({ sandboxId: x.id, err: e }, "metrics sample failed");
      })
      .finally(() => this.inflight.delete(x.id));
    this.inflight.set(x.id, p);
    return p;
  }
}
