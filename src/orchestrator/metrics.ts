/**
 * Sandbox resource metrics: a bounded in-memory history per sandbox (ring of the last
 * `historySamples` samples), filled by the sampler (sampler.ts). Samples carry the node's clock.
 */
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
