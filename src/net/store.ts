/**
 * Persistence of slot ownership in the node database (table `net_slots`, src/db/schema/net.ts).
 * Rows are written before the kernel objects exist (`building`) and deleted after they are gone,
 * so a crash at any point leaves a row that start-up can reconcile.
 */
import { eq } from "drizzle-orm";
import type { Db } from "../db/index.ts";
import { netSlots } from "../db/schema/net.ts";
import type { EgressPolicy } from "./policy.ts";
import { policyToJson } from "./policy.ts";

/** Life-cycle state of a persisted slot. */
export type SlotState = "building" | "pooled" | "allocated" | "draining";

/** A persisted slot row. */
export interface SlotRow {
  idx: number;
  netns: string;
  state: SlotState;
  sandboxId: string | null;
  /** policyToJson() form, or null. */
  policy: unknown;
  updatedAt: number;
}

/** Thin typed access to `net_slots`. */
export class SlotStore {
  constructor(private readonly db: Db) {}

  /** Insert or overwrite the row of `idx`. */
  put(idx: number, netns: string, state: SlotState, sandboxId: string | null = null, policy: EgressPolicy | null = null): void {
    const row = { idx, netns, state, sandboxId, policy: policy ? JSON.stringify(policyToJson(policy)) : null, updatedAt: Date.now() };
    this.db.orm.insert(netSlots).values(row).onConflictDoUpdate({ target: netSlots.idx, set: row }).run();
  }

  /** Delete the row of `idx` (no-op when absent). */
  delete(idx: number): void {
    this.db.orm.delete(netSlots).where(eq(netSlots.idx, idx)).run();
  }

  /** All rows, ordered by index. */
  all(): SlotRow[] {
    return this.db.orm
      .select()
      .from(netSlots)
      .orderBy(netSlots.idx)
      .all()
      .map((r) => ({ ...r, state: r.state as SlotState, policy: r.policy ? JSON.parse(r.policy) : null }));
  }

  /** Delete every row (after start-up reaped the kernel objects). */
  clear(): void {
    this.db.orm.delete(netSlots).run();
  }
}
