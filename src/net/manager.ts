/**
 * NetworkManager: owns every slot of this node, the warm pool, the pool worker and the DNS proxy.
 *
 * Slot states (a slot is in exactly one):
 *   free ──reserve──▶ building ──ok──▶ pooled ──allocate──▶ allocated ──release──▶ pooled
 *                        │ fail: rolled back, index freed        │  (reset: new tap, default policy)
 *   pooled ──worker drains above high watermark / shutdown──▶ destroyed ──▶ free
 *
 * Bounds: at most `maxSlots` indices exist (free list); the pool holds at most `high` slots after
 * the worker ran; each DNS-learned address list at most `dns.maxAddressesPerSlot`; every kernel
 * command has `commandTimeoutMs`. One background worker (not one per release) refills and drains.
 */
import type { Db } from "../db/index.ts";
import { logger } from "../observability/log.ts";
import { errorMessage } from "../util/error.ts";
import { mapLimit } from "../util/map-limit.ts";
import { ADOPT_PARALLEL, planAdoption, reapplySlot, replaceHostRules, type KeepSlot, type LostSlot } from "./adopt.ts";
import { DeadlineTimer, SYSTEM_CLOCK, type Clock } from "../util/deadline-timer.ts";
import type { NetConfig } from "./config.ts";
import { DnsProxy, systemResolvers } from "./dns-proxy.ts";
import { EgressService, type EgressDeps } from "./egress/service.ts";
import type { InterceptorStats } from "./egress/interceptor.ts";
import { NetError } from "./errors.ts";
import { applyDnsAllowed, applyPolicy, buildSlot, destroySlot, enableForwarding, reapSlots, type ReapReport, resetSlot, teardownHost } from "./netns.ts";
import { domainMatches } from "./domain.ts";
import { defaultPolicy, type EgressPolicy, policyToJson } from "./policy.ts";
import type { DnsAllowed } from "./rules.ts";
import { type AllocatedSlot, type Slot, slotLayout } from "./slot.ts";
import { type SlotRow, SlotStore } from "./store.ts";
import { Notifier } from "../util/wait.ts";
import { LearnedAddresses } from "./dns-learned.ts";

const log = logger("net");

/**
 * Policy installed in pooled slots. No VM is attached to a pooled slot, so it only has to be what
 * most sandboxes ask for: then allocation from the pool needs no kernel call at all.
 */
const POOLED: EgressPolicy = defaultPolicy();
const POOLED_JSON = JSON.stringify(policyToJson(POOLED));

/** Counters for tests, metrics and the bench. */
export interface NetStats {
  pooled: number;
  allocated: number;
  building: number;
  /** Slots being torn down. */
  draining: number;
  free: number;
  /** Current refill target (low..high). */
  target: number;
  poolHits: number;
  poolMisses: number;
  built: number;
  destroyed: number;
}

/** What `start()` did. */
export interface NetStartReport extends ReapReport {
  /** The slot rows the previous run had persisted. */
  previous: SlotRow[];
  /** Slots kept for sandboxes that outlive the previous run (`start({ keep })`), now allocated here. */
  adopted: AllocatedSlot[];
  /** Kept sandboxes whose slot could not be adopted (reaped with the rest), and why. */
  lost: LostSlot[];
}

/** See the module comment. Create, `start()`, use, `shutdown()`. */
export class NetworkManager {
  private readonly store: SlotStore;
  private readonly free: number[] = [];
  private readonly pool: Slot[] = [];
  private readonly allocated = new Map<number, AllocatedSlot>();
  private readonly bySandbox = new Map<string, number>();
  private readonly byNsIp = new Map<string, number>();
  private readonly learned: LearnedAddresses;
  private readonly locks = new Map<number, Promise<unknown>>();
  private building = 0;
  private draining = 0;
  private target: number;
  private started = false;
  private closed = false;
  private worker?: Promise<void>;
  private wakeWorker?: () => void;
  /** Waits for a build or teardown to end, or for a kick (allocate, release, shutdown). */
  private readonly changes = new Notifier();
  private dns?: DnsProxy;
  /** Fires when the first DNS-learned address runs out (see `closeExpiredDns`). */
  private readonly dnsExpiry: DeadlineTimer;
  private counters = { poolHits: 0, poolMisses: 0, built: 0, destroyed: 0 };

  /** The settings in force; after `start()`, `dns.port` and `egress.port` are the bound ports (relevant when configured 0). */
  cfg: NetConfig;
  private readonly egress: EgressService;

  /**
   * @param db open node database (migrations applied).
   * @param deps what the egress interceptor needs of the node (its secrets, a label for its CA).
   * @param clock time of DNS-learned addresses' expiry (a test's own clock).
   */
  constructor(cfg: NetConfig, db: Db, deps: EgressDeps = {}, private readonly clock: Clock = SYSTEM_CLOCK) {
    this.cfg = cfg;
    this.learned = new LearnedAddresses(cfg.dns.maxAddressesPerSlot);
    this.dnsExpiry = new DeadlineTimer(() => this.closeExpiredDns(), (err) => log.warn({ err }, "closing expired DNS-learned addresses failed"), clock);
    this.store = new SlotStore(db);
    this.egress = new EgressService(() => this.cfg, deps, (ip) => {
      const idx = this.byNsIp.get(ip);
      return idx === undefined ? undefined : this.allocated.get(idx);
    });
    this.target = cfg.pool.low;
    for (let i = cfg.maxSlots - 1; i >= 0; i--) this.free.push(i);
  }

  /**
   * Reap whatever a previous run left (namespaces, host veths and node chains with our prefix, and
   * their rows) but the slots of `keep`, install the node rules, start the DNS proxy, fill the pool
   * to the low watermark, then start the pool worker when `pool.maintenanceEnabled`.
   *
   * Keeping (issue 27): each kept sandbox's slot is found by its persisted row and checked whole
   * (netns, both veth ends, tap, egress chains: ./adopt.ts); its DNS-learned addresses are read
   * back from its AENV-DNS rules (names and expiry are in their comments); its rule set is
   * applied again idempotently with `policy` (or the row's) and the DNS proxy's current port;
   * then it is allocated to the sandbox as before the restart. A kept sandbox whose slot is
   * not whole, or cannot take its policy, is reported in `lost` and its slot reaped.
   * @returns what reaping removed, the rows the previous run had persisted, the adopted and lost slots
   * @throws NetError from the kernel commands; NetError `net.dns_bind` when the DNS proxy's port
   *   (`network.egress.dns_proxy_port`) cannot be bound.
   */
  async start(opts: { keep?: readonly KeepSlot[] } = {}): Promise<NetStartReport> {
    if (this.started) throw new NetError("net.bad_state", "NetworkManager.start() called twice", {});
    this.started = true;
    const stale = this.store.all();
    const plan = await planAdoption(this.cfg, stale, opts.keep ?? [], (p) => this.assertEnforceable(p), this.clock.now());
    const reaped = await reapSlots(this.cfg, new Set(plan.adopt.map((a) => a.slot.netnsName)));
    this.store.clear();
    // kept slots are allocated before the DNS proxy answers their guests' first queries
    const adopted: AllocatedSlot[] = [];
    for (const k of plan.adopt) {
      const a: AllocatedSlot = { ...k.slot, sandboxId: k.sandboxId, policy: k.policy };
      const at = this.free.indexOf(a.idx);
      if (at < 0) throw new NetError("net.bad_state", `slot ${a.idx} kept twice`, { idx: a.idx });
      this.free.splice(at, 1);
      this.allocated.set(a.idx, a);
      this.bySandbox.set(a.sandboxId, a.idx);
      this.byNsIp.set(a.nsVethIp, a.idx);
      const live = k.dnsAllowed.filter((e) => k.policy.allowDomains.some((d) => domainMatches(d, e.qname)));
      for (const e of live) {
        this.learned.learn(a.idx, e.ip, e.qname, e.expiresAt);
        this.dnsExpiry.armAt(e.expiresAt);
      }
      this.store.put(a.idx, a.netnsName, "allocated", a.sandboxId, a.policy);
      adopted.push(a);
    }
    if (this.cfg.dns.enabled) {
      // Bound first: the node rules and every slot's DNS redirect name the port actually bound.
      const upstream = this.cfg.dns.upstream.length > 0 ? this.cfg.dns.upstream : systemResolvers();
      this.dns = new DnsProxy({
        port: this.cfg.dns.port,
        upstream,
        timeoutMs: this.cfg.dns.timeoutMs,
        maxInflight: this.cfg.dns.maxInflight,
        onAnswer: (ip, qname, addrs) => this.onDnsAnswer(ip, qname, addrs),
      });
      await this.dns.start();
      this.cfg = { ...this.cfg, dns: { ...this.cfg.dns, port: this.dns.port } };
    }
    if (this.cfg.egress.enabled) {
      // bound before the node rules, which name its port
      const port = await this.egress.start();
      this.cfg = { ...this.cfg, egress: { ...this.cfg.egress, port } };
    }
    await enableForwarding(this.cfg);
    const chains = await replaceHostRules(this.cfg);
    const lost = [...plan.lost];
    const failed = await mapLimit([...adopted], ADOPT_PARALLEL, (a) =>
      this.serial(a.idx, () => reapplySlot(this.cfg, a, a.policy, this.liveDnsEntries(a.idx))).then(
        () => null,
        (e: unknown) => ({ a, e }),
      ),
    );
    for (const f of failed) {
      if (!f) continue;
      const { a, e } = f;
      lost.push({ sandboxId: a.sandboxId, reason: `re-applying its rules failed: ${errorMessage(e)}` });
      adopted.splice(adopted.indexOf(a), 1);
      await this.release(a).catch((d) => log.error({ err: d, idx: a.idx }, "reaping a slot that could not be adopted failed"));
    }
    const report = { ...reaped, chains };
    if (stale.length + report.netns.length + report.links.length > 0) log.warn({ rows: stale.length, ...report, adopted: adopted.length, lost }, "network state of a previous run: kept slots adopted, the rest reaped");
    // adopted slots with rules or an egress proxy: their redirects again (the node rules emptied the chain)
    await this.egress.sync(this.allocated.values());
    while (this.pool.length < this.cfg.pool.low) await this.buildPooled();
    if (this.cfg.pool.maintenanceEnabled) this.worker = this.runWorker();
    return { ...report, previous: stale, adopted, lost };
  }

  /**
   * Give `sandboxId` a slot with `policy` applied: a warm one from the pool, else one built now.
   * @throws NetError `net.capacity` when all `maxSlots` indices are in use (nothing is built),
   *   `net.setup_failed` when building failed (rolled back), `net.duplicate_sandbox`,
   *   `net.bad_policy` for domain rules while the DNS proxy is disabled, `net.shut_down`.
   */
  async allocate(policy: EgressPolicy, sandboxId: string): Promise<AllocatedSlot> {
    this.assertOpen();
    // the rules' secrets were checked when the policy was given (create, update): a secret
    // deleted since fails its requests, not a resume or a fork
    this.assertEnforceable(policy);
    await this.egress.check(policy, this.cfg.egress.enabled, { secrets: false });
    if (this.bySandbox.has(sandboxId)) {
      throw new NetError("net.duplicate_sandbox", `sandbox ${sandboxId} already holds slot ${this.bySandbox.get(sandboxId)}`, { sandboxId });
    }
    this.bySandbox.set(sandboxId, -1); // reserve the id while we await
    try {
      // Every index taken but the worker is finishing a pooled slot: wait for it (bounded) rather
      // than report a capacity error that is only a moment old.
      const until = Date.now() + this.cfg.commandTimeoutMs;
      while (this.pool.length === 0 && this.free.length === 0 && this.building > 0 && Date.now() < until) await this.changed(until);
      let slot = this.pool.shift();
      if (slot) {
        this.counters.poolHits++;
        try {
          if (JSON.stringify(policyToJson(policy)) !== POOLED_JSON) await this.serial(slot.idx, () => applyPolicy(this.cfg, slot!, policy, []));
        } catch (e) {
          await this.destroy(slot);
          throw e;
        }
      } else {
        this.counters.poolMisses++;
        this.target = Math.min(this.cfg.pool.high, this.target + 1);
        slot = slotLayout(this.cfg, this.reserve());
        await this.build(slot, policy);
      }
      const a: AllocatedSlot = { ...slot, sandboxId, policy };
      this.allocated.set(slot.idx, a);
      this.bySandbox.set(sandboxId, slot.idx);
      this.byNsIp.set(slot.nsVethIp, slot.idx);
      this.store.put(slot.idx, slot.netnsName, "allocated", sandboxId, policy);
      if (this.closed) {
        await this.release(a);
        throw new NetError("net.shut_down", "network manager shut down during allocation", { sandboxId });
      }
      try {
        await this.egress.sync(this.allocated.values());
      } catch (e) {
        // an egress proxy not in force would let the sandbox out directly: no slot then
        await this.release(a);
        throw e;
      }
      return a;
    } catch (e) {
      if (this.bySandbox.get(sandboxId) === -1) this.bySandbox.delete(sandboxId);
      throw e;
    } finally {
      this.kick();
    }
  }

  /**
   * Take a slot back. It is reset (fresh tap, default policy, no DNS-learned addresses) and returned to the pool; the worker
   * drains the pool down to the high watermark asynchronously. Without maintenance, a release above
   * the high watermark destroys the slot at once.
   * @throws NetError `net.unknown_slot` when the slot/sandbox is not allocated here.
   */
  async release(slotOrSandbox: Slot | string): Promise<void> {
    const a = this.lookup(slotOrSandbox);
    this.allocated.delete(a.idx);
    this.bySandbox.delete(a.sandboxId);
    this.byNsIp.delete(a.nsVethIp);
    this.learned.drop(a.idx);
    if (a.policy.rules.length || a.policy.egressProxy) await this.egress.sync(this.allocated.values()).catch((e) => log.error({ err: e, idx: a.idx }, "egress redirects of a released slot not removed"));
    const slot = slotLayout(this.cfg, a.idx);
    const keep = !this.closed && (this.cfg.pool.maintenanceEnabled || this.pool.length < this.cfg.pool.high);
    if (keep) {
      try {
        await this.serial(a.idx, () => resetSlot(this.cfg, slot, POOLED));
        this.store.put(a.idx, slot.netnsName, "pooled");
        this.pool.push(slot);
        this.kick();
        return;
      } catch (e) {
        log.warn({ err: e, idx: a.idx }, "reset of a released slot failed; destroying it");
      }
    }
    await this.destroy(slot);
  }

  /**
   * Replace the egress policy of an allocated slot at runtime (`PUT /sandboxes/{id}/network`).
   * Takes effect for the next packet; DNS-learned addresses whose name no longer matches an
   * allowOut domain are dropped.
   * @throws NetError `net.unknown_slot`, `net.command_failed`.
   */
  async updatePolicy(slotOrSandbox: Slot | string, policy: EgressPolicy): Promise<AllocatedSlot> {
    this.assertOpen();
    await this.checkPolicy(policy);
    const a = this.lookup(slotOrSandbox);
    await this.serial(a.idx, async () => {
      this.learned.retain(a.idx, (qname) => policy.allowDomains.some((d) => domainMatches(d, qname)));
      await applyPolicy(this.cfg, a, policy, this.liveDnsEntries(a.idx));
    });
    a.policy = policy;
    this.store.put(a.idx, a.netnsName, "allocated", a.sandboxId, policy);
    await this.egress.sync(this.allocated.values());
    return a;
  }

  /**
   * Check a policy given by a create or an update against this node (domain rules need the DNS
   * proxy; rules and egress proxies need the interceptor, existing secrets and the node's limits)
   * before anything is applied.
   * @throws NetError `net.bad_policy` naming the field
   */
  async checkPolicy(policy: EgressPolicy): Promise<void> {
    this.assertEnforceable(policy);
    await this.egress.check(policy, this.cfg.egress.enabled, { secrets: true });
  }

  /** The node egress CA's certificate (PEM) guests are given to trust, or null when interception is off. */
  caBundle(): string | null {
    return this.cfg.egress.enabled ? this.egress.caBundle() : null;
  }

  /** The egress interceptor's counters, or null when it is off. */
  egressStats(): InterceptorStats | null {
    return this.egress.stats();
  }

  /** The allocated slot of a sandbox, if any. */
  slotOf(sandboxId: string): AllocatedSlot | undefined {
    const idx = this.bySandbox.get(sandboxId);
    return idx === undefined || idx < 0 ? undefined : this.allocated.get(idx);
  }

  /** Addresses currently admitted for a slot through DNS answers (sorted). */
  dnsAllowedOf(slotOrSandbox: Slot | string): string[] {
    return this.liveDnsAddrs(this.lookup(slotOrSandbox).idx);
  }

  /** Current counters. */
  stats(): NetStats {
    return {
      pooled: this.pool.length,
      allocated: this.allocated.size,
      building: this.building,
      draining: this.draining,
      free: this.free.length,
      target: this.target,
      ...this.counters,
    };
  }

  /**
   * Resolve once the worker has nothing to do (pool within [target, high]) or `timeoutMs` passed.
   * @returns true when idle was reached.
   */
  async waitIdle(timeoutMs: number): Promise<boolean> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      if (this.building === 0 && this.draining === 0 && this.pool.length <= this.cfg.pool.high && (this.pool.length >= this.target || this.free.length === 0)) return true;
      if (Date.now() >= until) return false;
      await this.changed(until);
    }
  }

  /**
   * Stop the worker and the DNS proxy, delete every pooled and allocated slot and the node rules.
   * Idempotent. Allocation after this throws `net.shut_down`.
   */
  async shutdown(): Promise<void> {
    if (this.closed) return;
    await this.quiesce();
    const all = [...this.pool.splice(0), ...[...this.allocated.values()].map((a) => slotLayout(this.cfg, a.idx))];
    this.allocated.clear();
    this.bySandbox.clear();
    this.byNsIp.clear();
    for (const s of all) await this.destroy(s);
    if (this.started) await teardownHost(this.cfg);
    this.store.clear();
  }

  /**
   * Stop the worker, the DNS proxy and its expiry timer but leave every slot, rule and row as it is,
   * for the next node to keep (`start({ keep })`) or reap (issue 27's detach). Builds under way
   * are waited for. Idempotent; allocation afterwards throws `net.shut_down`.
   */
  async detach(): Promise<void> {
    if (this.closed) return;
    // the interceptor goes with this process (its redirects stay; the next node's start rewrites them)
    await this.quiesce();
  }

  /** Refuse allocation from now on; stop the worker, the DNS proxy, its expiry timer and the egress interceptor; wait for slot builds and drains under way. */
  private async quiesce(): Promise<void> {
    this.closed = true;
    this.kick();
    await this.worker;
    await this.dnsExpiry.stop();
    await this.dns?.stop();
    await this.egress.stop();
    while (this.building > 0 || this.draining > 0) await this.changed(Infinity);
  }

  // ---- internals -------------------------------------------------------------------------

  private assertOpen(): void {
    if (!this.started) throw new NetError("net.bad_state", "NetworkManager used before start()", {});
    if (this.closed) throw new NetError("net.shut_down", "network manager is shut down", {});
  }

  /** Domain rules work only through the DNS proxy; refuse them rather than silently never opening. */
  private assertEnforceable(policy: EgressPolicy): void {
    if (policy.allowDomains.length > 0 && !this.cfg.dns.enabled) {
      const entry = policyToJson(policy).allowOut[policy.allowCidrs.length];
      throw new NetError("net.bad_policy", `allowOut ${JSON.stringify(entry)}: domain rules need network.egress.dns_proxy_enabled`, {
        field: "allowOut",
        entry,
      });
    }
  }

  private reserve(): number {
    const idx = this.free.pop();
    if (idx === undefined) {
      throw new NetError("net.capacity", `no free network slot: all ${this.cfg.maxSlots} are in use`, {
        maxSlots: this.cfg.maxSlots,
        inUse: this.cfg.maxSlots,
      });
    }
    return idx;
  }

  private lookup(slotOrSandbox: Slot | string): AllocatedSlot {
    const idx = typeof slotOrSandbox === "string" ? this.bySandbox.get(slotOrSandbox) : slotOrSandbox.idx;
    const a = idx === undefined ? undefined : this.allocated.get(idx);
    if (!a) {
      const what = typeof slotOrSandbox === "string" ? { sandboxId: slotOrSandbox } : { idx: slotOrSandbox.idx };
      throw new NetError("net.unknown_slot", `no allocated slot for ${JSON.stringify(what)}`, what);
    }
    return a;
  }

  /** Run kernel updates of one slot one after another (policy vs DNS updates must not interleave). */
  private async serial<T>(idx: number, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(idx) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.locks.set(idx, tail);
    try {
      return await next;
    } finally {
      if (this.locks.get(idx) === tail) this.locks.delete(idx);
    }
  }

  private async buildPooled(): Promise<void> {
    const slot = slotLayout(this.cfg, this.reserve());
    await this.build(slot, POOLED, () => {
      this.store.put(slot.idx, slot.netnsName, "pooled");
      this.pool.push(slot);
    });
  }

  /**
   * Build `slot` (its index reserved) with `policy`, counted in `building`; `built` runs before
   * the count drops, so a waiter never sees neither the build nor its result. A failure removes
   * what was built and frees the index.
   */
  private async build(slot: Slot, policy: EgressPolicy, built?: () => void): Promise<void> {
    this.store.put(slot.idx, slot.netnsName, "building");
    this.building++;
    try {
      await buildSlot(this.cfg, slot, policy);
      this.counters.built++;
      built?.();
    } catch (e) {
      this.store.delete(slot.idx);
      this.free.push(slot.idx);
      throw e;
    } finally {
      this.building--;
      this.notify();
    }
  }

  private async destroy(slot: Slot): Promise<void> {
    this.draining++;
    try {
      this.store.put(slot.idx, slot.netnsName, "draining");
      await destroySlot(this.cfg, slot);
      this.store.delete(slot.idx);
      this.free.push(slot.idx);
      this.counters.destroyed++;
    } finally {
      this.draining--;
      this.notify();
    }
  }

  private kick(): void {
    const w = this.wakeWorker;
    this.wakeWorker = undefined;
    w?.();
    this.notify();
  }

  /** Wake every `changed()` wait: a build or teardown ended, or the pool's state moved. */
  private notify(): void {
    this.changes.notify();
  }

  /** Resolves at the next `notify()`, or at `until` (unix ms) at the latest. */
  private changed(until: number): Promise<void> {
    return this.changes.wait(until - Date.now());
  }

  /** The single pool worker: drain above high, refill up to target, else sleep until kicked. */
  private async runWorker(): Promise<void> {
    while (!this.closed) {
      try {
        if (this.pool.length > this.cfg.pool.high) {
          await this.destroy(this.pool.pop()!);
          continue;
        }
        if (this.pool.length < this.target && this.free.length > 0) {
          await this.buildPooled();
          continue;
        }
      } catch (e) {
        log.error({ err: e }, "pool worker step failed; backing off");
        await Bun.sleep(this.cfg.pool.retryBackoffMs);
        continue;
      }
      await new Promise<void>((res) => (this.wakeWorker = res));
    }
  }

  /**
   * Close DNS-learned addresses whose time ran out (run by `dnsExpiry` when the first one does;
   * a slot whose rules fail to update is logged and tried again at the next expiry).
   * @returns the next expiry (unix ms), or null when no address is learned.
   */
  private async closeExpiredDns(): Promise<number | null> {
    for (const idx of this.learned.expiredSlots(this.clock.now())) {
      const a = this.allocated.get(idx);
      if (!a) continue;
      try {
        await this.serial(idx, () => applyDnsAllowed(this.cfg, a, this.liveDnsEntries(idx)));
      } catch (e) {
        log.warn({ err: e, idx }, "closing expired DNS-learned addresses failed");
      }
    }
    return this.learned.nextExpiry((idx) => this.allocated.has(idx));
  }

  private liveDnsAddrs(idx: number): string[] {
    return this.liveDnsEntries(idx).map((e) => e.ip);
  }

  /** The unexpired DNS-learned addresses of a slot (expired ones are dropped), sorted by address. */
  private liveDnsEntries(idx: number): DnsAllowed[] {
    return this.learned.live(idx, this.clock.now());
  }

  /** DNS proxy hook: admit A records of names matching the querying slot's allowOut domains. */
  private async onDnsAnswer(clientIp: string, qname: string, addrs: { ip: string; ttl: number }[]): Promise<void> {
    const idx = this.byNsIp.get(clientIp);
    const a = idx === undefined ? undefined : this.allocated.get(idx);
    if (!a || !a.policy.allowDomains.some((d) => domainMatches(d, qname))) return;
    await this.serial(a.idx, async () => {
      const before = this.liveDnsAddrs(a.idx).join(",");
      const now = this.clock.now();
      for (const { ip, ttl } of addrs) {
        const expiresAt = now + Math.max(ttl, this.cfg.dns.minTtlSecs) * 1000;
        this.learned.learn(a.idx, ip, qname, expiresAt);
        this.dnsExpiry.armAt(expiresAt);
      }
      const after = this.liveDnsEntries(a.idx);
      // the kernel holds the set (and each address's first expiry, for a node that adopts the slot)
      if (after.map((e) => e.ip).join(",") !== before) await applyDnsAllowed(this.cfg, a, after);
    });
  }
}
