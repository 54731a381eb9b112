/**
 * The restore pool (issue 9 item 7, `[pool.restore]`): sandboxes of a snapshot restored ahead of
 * requests, so that a create finds one ready. Measured on this host (QEMU TCG, bench/snapshot.ts
 * and the decomposition in the commit that added this): of a create restored on request, the VMM
 * spawn and state load take about 75 ms, but envd's first answers after it and the SDK's first
 * `commands.run` in the fresh QEMU take 600-700 ms: TCG translates every code path a new QEMU
 * runs (guest kernel, envd, the command's process), so the first of each is 2-3 times the second.
 * A pooled VM is restored, envd answered and initialised, and one command of the SDK's kind run
 * (its translations made), then paused (no guest CPU while it waits). A create adopts it: its
 * egress policy set, the VM continued, envd re-initialised with the create's token, env vars,
 * clock and host name. A VM restored on request costs nothing more than before; the pool only
 * moves the work to quiet moments.
 *
 * This module is the pool's bookkeeping (which snapshots are wanted, how many VMs are ready,
 * claimed or being made, when to make more); its host (the VM runtime) makes and discards VMs.
 * Watermarks are per pooled snapshot: below `lowWatermark` ready VMs the pool makes VMs one at a
 * time until `highWatermark` are ready. Only the `snapshots` snapshots most recently created
 * from are pooled; a snapshot dropped from that list, deleted or replaced loses its VMs. A VM
 * claimed for a create (`claim`) that is not started (`take`) within `claimTimeoutMs` is
 * discarded. A pooled VM is an ordinary VM of the runtime under a sandbox id of its own (its
 * work dir, VMM record, slot), so a crashed node's start-up reaps it like any other.
 */
import { logger } from "../observability/log.ts";
import { pauseFor } from "./pause-for.ts";

const log = logger("sandbox.restore_pool");

/** Settings of the pool (`[pool.restore]`). Times in ms. */
export interface RestorePoolOptions {
  lowWatermark: number;
  /** 0: no pool. */
  highWatermark: number;
  /** Snapshots pooled at once (the most recently created from). */
  snapshots: number;
  claimTimeoutMs: number;
  /** Wait after a failed fill before the next one. */
  retryBackoffMs: number;
  /** Quiet time after the node's last sandbox start before a fill begins. */
  fillDelayMs: number;
}

/** What the pool asks of its host (the VM runtime). */
export interface RestorePoolHost<C> {
  /** Restore, warm and pause a VM of the snapshot `ctx` describes; resolves with its sandbox id. */
  fill(snapshotId: string, ctx: C, signal: AbortSignal): Promise<string>;
  /** Stop VM `id` and free what it holds. Never throws. */
  discard(id: string, why: string): Promise<void>;
  /** Whether a snapshot may still be pooled (present, not deleted or replaced). */
  usable(snapshotId: string): boolean;
  /** Resolves once no sandbox start of the host has been in progress for `quietMs`. */
  quiet(quietMs: number, signal: AbortSignal): Promise<void>;
}

type EntryState = "ready" | "claimed";

interface Entry {
  id: string;
  snapshotId: string;
  state: EntryState;
  /** When it was claimed (ms, the pool's clock). */
  claimedAt: number;
}

interface Wanted<C> {
  snapshotId: string;
  ctx: C;
  /** Set when ready VMs fell below the low watermark; cleared at the high one. */
  refilling: boolean;
}

/** Counts of one snapshot's pool. */
export interface PoolCounts {
  ready: number;
  claimed: number;
  filling: number;
}

/** The restore pool's bookkeeping and its fill loop. */
export class RestorePool<C> {
  private readonly entries = new Map<string, Entry>();
  /** Pooled snapshots, least recently wanted first. */
  private readonly wanted: Wanted<C>[] = [];
  private filling: { snapshotId: string } | null = null;
  private readonly stop = new AbortController();
  private wake: (() => void) | null = null;
  private loop: Promise<void> | null = null;
  /** Fills that ended in a VM, fills that failed, VMs discarded, VMs taken (for tests and logs). */
  readonly counters = { filled: 0, failed: 0, discarded: 0, taken: 0 };

  constructor(
    private readonly o: RestorePoolOptions,
    private readonly host: RestorePoolHost<C>,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Whether the pool may hold VMs at all. */
  get enabled(): boolean {
    return this.o.highWatermark > 0 && this.o.snapshots > 0;
  }

  /** Start the fill loop (no-op when disabled or started). */
  start(): void {
    if (!this.enabled || this.loop || this.stop.signal.aborted) return;
    this.loop = this.run();
  }

  /**
   * A create started from `snapshotId` (described by `ctx` for fills): pool it, most recently
   * wanted first; the least recently wanted past `snapshots` loses its ready VMs.
   */
  want(snapshotId: string, ctx: C): void {
    if (!this.enabled) return;
    const i = this.wanted.findIndex((w) => w.snapshotId === snapshotId);
    const w = i >= 0 ? this.wanted.splice(i, 1)[0]! : { snapshotId, ctx, refilling: false };
    w.ctx = ctx;
    this.wanted.push(w);
    this.start();
    while (this.wanted.length > this.o.snapshots) {
      const old = this.wanted.shift()!;
      for (const e of [...this.entries.values()]) if (e.snapshotId === old.snapshotId && e.state === "ready") void this.drop(e, "snapshot no longer pooled");
    }
    this.kick();
  }

  /**
   * Reserve a ready VM of `snapshotId` for a create.
   * @returns its sandbox id (the create must use it and `take` it), or null when none is ready
   */
  claim(snapshotId: string): string | null {
    for (const e of this.entries.values()) {
      if (e.snapshotId !== snapshotId || e.state !== "ready") continue;
      e.state = "claimed";
      e.claimedAt = this.now();
      this.kick();
      return e.id;
    }
    return null;
  }

  /**
   * Hand VM `id` over to its create (it leaves the pool).
   * @returns the snapshot it was restored from, or null when `id` is not a claimed VM of the pool
   *   (never claimed, or its claim lapsed and it was discarded)
   */
  take(id: string): string | null {
    const e = this.entries.get(id);
    if (!e || e.state !== "claimed") return null;
    this.entries.delete(id);
    this.counters.taken++;
    this.kick();
    return e.snapshotId;
  }

  /** VM `id` ended by itself (its VMM exited): forget it and discard what is left of it. */
  lost(id: string): void {
    const e = this.entries.get(id);
    if (e) void this.drop(e, "VM exited while pooled");
  }

  /** Wake the fill loop so that it sweeps now (a snapshot may have been deleted). */
  poke(): void {
    this.kick();
  }

  /** Whether `id` is a VM of the pool (ready or claimed). */
  has(id: string): boolean {
    return this.entries.has(id);
  }

  /** Counts of `snapshotId`'s pool. */
  counts(snapshotId: string): PoolCounts {
    let ready = 0;
    let claimed = 0;
    for (const e of this.entries.values()) {
      if (e.snapshotId !== snapshotId) continue;
      if (e.state === "ready") ready++;
      else claimed++;
    }
    return { ready, claimed, filling: this.filling?.snapshotId === snapshotId ? 1 : 0 };
  }

  /** Snapshots pooled, least recently wanted first. */
  pooledSnapshots(): string[] {
    return this.wanted.map((w) => w.snapshotId);
  }

  /**
   * Discard claims older than `claimTimeoutMs` and the VMs of snapshots no longer usable (those
   * leave the pooled list). Runs in the fill loop; callable at any time.
   */
  async sweep(): Promise<void> {
    for (let i = this.wanted.length - 1; i >= 0; i--) if (!this.host.usable(this.wanted[i]!.snapshotId)) this.wanted.splice(i, 1);
    const pooled = new Set(this.wanted.map((w) => w.snapshotId));
    const t = this.now();
    const drops: Promise<void>[] = [];
    for (const e of [...this.entries.values()]) {
      if (e.state === "claimed" && t - e.claimedAt > this.o.claimTimeoutMs) drops.push(this.drop(e, "claim not started in time"));
      else if (!this.host.usable(e.snapshotId)) drops.push(this.drop(e, "snapshot deleted or replaced"));
      else if (e.state === "ready" && !pooled.has(e.snapshotId)) drops.push(this.drop(e, "snapshot no longer pooled"));
    }
    await Promise.all(drops);
  }

  /** Stop filling and discard every VM of the pool (ready and claimed). */
  async close(): Promise<void> {
    this.stop.abort();
    this.kick();
    await this.loop?.catch(() => {});
    this.loop = null;
    await Promise.all([...this.entries.values()].map((e) => this.drop(e, "pool closed")));
  }

  private async drop(e: Entry, why: string): Promise<void> {
    if (this.entries.get(e.id) !== e) return;
    this.entries.delete(e.id);
    this.counters.discarded++;
    this.kick();
    await this.host.discard(e.id, why);
    log.info({ sandboxId: e.id, snapshot: e.snapshotId, why }, "restore pool VM discarded");
  }

  private kick(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  /** The pooled snapshot to fill next, most recently wanted first, or null. */
  private next(): Wanted<C> | null {
    for (let i = this.wanted.length - 1; i >= 0; i--) {
      const w = this.wanted[i]!;
      const { ready } = this.counts(w.snapshotId);
      if (ready < this.o.lowWatermark) w.refilling = true;
      if (ready >= this.o.highWatermark) w.refilling = false;
      if (w.refilling) return w;
    }
    return null;
  }

  private async run(): Promise<void> {
    const signal = this.stop.signal;
    while (!signal.aborted) {
      await this.sweep();
      const w = this.next();
      if (!w) {
        // woken by want/claim/take/lost or close; a lapsed claim is swept at the latest then
        await new Promise<void>((r) => {
          const t = setTimeout(() => {
            if (this.wake === done) this.wake = null;
            r();
          }, this.o.claimTimeoutMs);
          const done = () => {
            clearTimeout(t);
            r();
          };
          this.wake = done;
        });
        continue;
      }
      try {
        await this.host.quiet(this.o.fillDelayMs, signal);
      } catch {
        break; // closed
      }
      if (signal.aborted) break;
      this.filling = { snapshotId: w.snapshotId };
      let id: string | null = null;
      try {
        id = await this.host.fill(w.snapshotId, w.ctx, signal);
      } catch (e) {
        this.counters.failed++;
        if (!signal.aborted) {
          log.warn({ snapshot: w.snapshotId, err: e }, "restore pool fill failed");
          await pauseFor(this.o.retryBackoffMs, signal);
        }
      } finally {
        this.filling = null;
      }
      if (id === null) continue;
      const entry: Entry = { id, snapshotId: w.snapshotId, state: "ready", claimedAt: 0 };
      this.entries.set(id, entry);
      this.counters.filled++;
      if (signal.aborted || !this.wanted.includes(w)) {
        await this.drop(entry, signal.aborted ? "pool closed" : "snapshot no longer pooled");
        continue;
      }
      log.info({ sandboxId: id, snapshot: w.snapshotId, ...this.counts(w.snapshotId) }, "restore pool VM ready");
    }
  }
}
