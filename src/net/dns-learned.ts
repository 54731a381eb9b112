/**
 * The addresses each slot learned from DNS answers for its allowOut domains (the DNS proxy
 * admits an A record's address until its TTL, at least `[network.dns] min_ttl_secs`, runs out).
 * Per slot at most `max_addresses_per_slot`: past it the least recently refreshed go first.
 * Plain bookkeeping: the manager (manager.ts) applies the sets to the slot's rules and owns the
 * timer that closes expired addresses.
 */
import { LruMap } from "../util/lru.ts";
import type { DnsAllowed } from "./rules.ts";

interface Entry {
  qname: string;
  /** Unix ms. */
  expiresAt: number;
}

/** DNS-learned addresses of every slot, by slot index. */
export class LearnedAddresses {
  readonly #slots = new Map<number, LruMap<string, Entry>>();

  /** @param maxPerSlot addresses kept per slot */
  constructor(private readonly maxPerSlot: number) {}

  #slot(idx: number): LruMap<string, Entry> {
    let m = this.#slots.get(idx);
    if (!m) this.#slots.set(idx, (m = new LruMap(this.maxPerSlot)));
    return m;
  }

  /** Admit (or refresh) `ip` for slot `idx` until `expiresAt` (unix ms), as an answer for `qname`. */
  learn(idx: number, ip: string, qname: string, expiresAt: number): void {
    this.#slot(idx).set(ip, { qname, expiresAt });
  }

  /** Forget everything slot `idx` learned (released). */
  drop(idx: number): void {
    this.#slots.delete(idx);
  }

  /** Forget slot `idx`'s addresses learned for names `keep` refuses (its policy changed). */
  retain(idx: number, keep: (qname: string) => boolean): void {
    const m = this.#slots.get(idx);
    if (m) for (const [ip, e] of m) if (!keep(e.qname)) m.delete(ip);
  }

  /** The unexpired addresses of slot `idx` at `now` (unix ms; expired ones are dropped), sorted by address. */
  live(idx: number, now: number): DnsAllowed[] {
    const m = this.#slots.get(idx);
    if (!m) return [];
    for (const [ip, e] of m) if (e.expiresAt <= now) m.delete(ip);
    return [...m.entries()].map(([ip, e]) => ({ ip, qname: e.qname, expiresAt: e.expiresAt })).sort((x, y) => (x.ip < y.ip ? -1 : x.ip > y.ip ? 1 : 0));
  }

  /** Slots holding an address expired at `now` (unix ms). */
  expiredSlots(now: number): number[] {
    return [...this.#slots].filter(([, m]) => [...m.values()].some((e) => e.expiresAt <= now)).map(([idx]) => idx);
  }

  /** The earliest expiry (unix ms) among the slots `include` accepts, or null when none holds an address. */
  nextExpiry(include: (idx: number) => boolean): number | null {
    let next: number | null = null;
    for (const [idx, m] of this.#slots) {
      if (!include(idx)) continue;
      for (const e of m.values()) if (next === null || e.expiresAt < next) next = e.expiresAt;
    }
    return next;
  }
}
