/**
 * One-use terminal tickets: the authenticated `POST /sandboxes/{id}/terminal` mints one, the
 * terminal WebSocket's first frame redeems it. A ticket is bound to one sandbox, expires after
 * `ttlMs` and works once, so it never stands in for the API key anywhere else.
 */
import { randomBytes, timingSafeEqual } from "node:crypto";
import { LruMap } from "../util/lru.ts";

/** Most tickets outstanding at once; minting beyond it drops the oldest. */
export const MAX_OUTSTANDING_TICKETS = 1024;

interface Entry {
  sandboxId: string;
  expiresAt: number;
}

/** Outstanding tickets of one listener. `now` is injectable for tests (unix ms). */
export class TicketBook {
  /** Oldest first: past MAX_OUTSTANDING_TICKETS the oldest goes. */
  private readonly tickets = new LruMap<string, Entry>(MAX_OUTSTANDING_TICKETS);

  constructor(
    private readonly ttlMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** A fresh ticket for `sandboxId` (64 hex chars) and its expiry (unix ms). */
  mint(sandboxId: string): { ticket: string; expiresAt: number } {
    this.sweep();
    const ticket = randomBytes(32).toString("hex");
    const expiresAt = this.now() + this.ttlMs;
    this.tickets.set(ticket, { sandboxId, expiresAt });
    return { ticket, expiresAt };
  }

  /**
   * Use `ticket` for `sandboxId`: true once for a live ticket minted for that sandbox. A ticket
   * presented for another sandbox is spent all the same (it was shown to the wrong place).
   */
  redeem(ticket: unknown, sandboxId: string): boolean {
    if (typeof ticket !== "string" || !/^[0-9a-f]{64}$/.test(ticket)) return false;
    const e = this.tickets.peek(ticket);
    if (!e) return false;
    this.tickets.delete(ticket);
    const a = Buffer.from(e.sandboxId);
    const b = Buffer.from(sandboxId);
    return e.expiresAt >= this.now() && a.length === b.length && timingSafeEqual(a, b);
  }

  /** Tickets still outstanding (expired ones included until the next mint). */
  get size(): number {
    return this.tickets.size;
  }

  private sweep(): void {
    const t = this.now();
    for (const [k, e] of this.tickets) if (e.expiresAt < t) this.tickets.delete(k);
  }
}
