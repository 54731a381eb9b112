/**
 * Sandbox resource metrics: a bounded in-memory history per sandbox (ring of the last
 * `historySamples` samples) and the sampler loop that fills it every `sampleIntervalMs` by asking
 * the runtime for one sample of each running sandbox. Samples are taken with the node's clock.
 */
import type { Logger } from "pino";
import type { GuestTarget, RuntimeMetrics } from "./runtime.ts";
import type { SandboxMetricsSample } from "./types.ts";

/** Fixed-capacity ring of samples, oldest first when read. */
class SampleRing {
  private readonly buf: SandboxMetricsSample[] = [];
  private next = 0;

  constructor(private readonly capacity: number) {}

  push(s: SandboxMetricsSample): void {
    if (this.buf.length < this.capacity) this.buf.push(s);
    else this.buf[this.next] = s;
    this.next = (this.next + 1) % this.capacity;
  }

  /** All samples, oldest first. */
  all(): SandboxMetricsSample[] {
    return this.buf.length < this.capacity ? [...this.buf] : [...this.buf.slice(this.next), ...this.buf.slice(0, this.next)];
  }

  last(): SandboxMetricsSample | undefined {
    // `next` is one past the newest, also before the ring is full
    return this.buf.length === 0 ? undefined : this.buf[(this.next + this.capacity - 1) % this.capacity];
  }
}

/** Per-sandbox bounded metrics history. */
export class MetricsHistory {
  private readonly rings = new Map<string, SampleRing>();

  /** @param capacity samples kept per sandbox (>= 1) */
  constructor(private readonly capacity: number) {}

  /** Append a sample of `id` (drops the oldest beyond the capacity). */
  add(id: string, s: SandboxMetricsSample): void {
    let r = this.rings.get(id);
    if (!r) this.rings.set(id, (r = new SampleRing(this.capacity)));
    r.push(s);
  }

  /**
   * Samples of `id` taken in [startMs, endMs] (both inclusive, unix ms; open when absent), oldest first.
   */
  range(id: string, startMs?: number, endMs?: number): SandboxMetricsSample[] {
    const all = this.rings.get(id)?.all() ?? [];
    return all.filter((s) => (startMs === undefined || s.at >= startMs) && (endMs === undefined || s.at <= endMs));
  }

  /** The newest sample of `id`, if any. */
  latest(id: string): SandboxMetricsSample | undefined {
    return this.rings.get(id)?.last();
  }

  /** Forget `id` (it was killed). */
  drop(id: string): void {
    this.rings.delete(id);
  }

  /** Ids with at least one sample. */
  ids(): string[] {
    return [...this.rings.keys()];
  }
}

/** Settings of the sampler (`[metrics]`). */
export interface SamplerOptions {
  intervalMs: number;
  timeoutMs: number;
}

/**
 * Samples every running sandbox each `intervalMs` (one round at a time: a slow round delays the
 * next instead of piling up). Owned by the orchestrator, which starts and stops it.
 */
export class MetricsSampler {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private round: Promise<void> | undefined;
  private stopped = false;

  constructor(
    /** The runtime's metrics capability; absent: nothing is sampled. */
    private readonly runtime: RuntimeMetrics | undefined,
    private readonly history: MetricsHistory,
    /** The sandboxes to sample this round (the orchestrator's running records). */
    private readonly targets: () => GuestTarget[],
    private readonly opts: SamplerOptions,
    private readonly now: () => number,
    private readonly log: Logger,
  ) {}

  /** Start the loop (no-op when the runtime cannot sample). */
  start(): void {
    if (!this.runtime || this.stopped) return;
    this.schedule();
  }

  /** Stop the loop and wait for a round in progress. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.round;
  }

  /** Take one round of samples now (the loop calls it; tests may too). */
  sampleOnce(): Promise<void> {
    this.round ??= this.doRound().finally(() => (this.round = undefined));
    return this.round;
  }

  private schedule(): void {
    this.timer = setTimeout(() => {
      void this.sampleOnce().finally(() => {
        if (!this.stopped) this.schedule();
      });
    }, this.opts.intervalMs);
  }

  private async doRound(): Promise<void> {
    const runtime = this.runtime;
    if (!runtime) return;
    await Promise.all(
      this.targets().map(async (t) => {
        try {
          const s = await runtime.sample(t, AbortSignal.timeout(this.opts.timeoutMs));
          this.history.add(t.id, { ...s, at: this.now() });
        } catch (e) {
          // a sandbox being paused or killed right now, or a busy guest: try again next round
          this.log.debug({ sandboxId: t.id, err: e }, "metrics sample failed");
        }
      }),
    );
  }
}
