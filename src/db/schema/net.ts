/**
 * Network slots this node owns (src/net). One row per slot index that exists in the kernel or is
 * being built; deleted when the slot is torn down. A restarted node reads it to know which slots
 * (and which sandboxes' policies) it had.
 */
import { integer, sqliteTable, text } from "drizzle-orm/sqlite-core";

export const netSlots = sqliteTable("net_slots", {
  /** Slot index; names the netns `<prefix><idx>` and derives all addresses. */
  idx: integer("idx").primaryKey(),
  /** Netns name at the time of creation (prefix may differ between nodes sharing a db file). */
  netns: text("netns").notNull(),
  /** building | pooled | allocated | draining */
  state: text("state").notNull(),
  /** Owning sandbox while allocated. */
  sandboxId: text("sandbox_id").unique(),
  /** Egress policy JSON (policyToJson) while allocated. */
  policy: text("policy"),
  /** Unix ms. */
  updatedAt: integer("updated_at").notNull(),
});
