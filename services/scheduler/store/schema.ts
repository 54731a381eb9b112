/**
 * The scheduler's SQLite tables (drizzle): bindings and the nodes' last reports. Times are unix
 * milliseconds.
 */
import { index, integer, sqliteTable, text } from "drizzle-orm/sqlite-core";

export const bindings = sqliteTable(
  "bindings",
  {
    sandboxId: text("sandbox_id").primaryKey(),
    nodeId: text("node_id").notNull(),
    endpoint: text("endpoint").notNull(),
    updatedAt: integer("updated_at").notNull(),
    /** Binding.held: the node itself reported the sandbox. */
    held: integer("held", { mode: "boolean" }).notNull().default(true),
  },
  (t) => [index("bindings_node_idx").on(t.nodeId)],
);

export const nodeReports = sqliteTable("node_reports", {
  nodeId: text("node_id").primaryKey(),
  /** ObservedNode as proto JSON (ObservedNode.toJSON). */
  node: text("node", { mode: "json" }).notNull(),
  /** P2pEndpoint as JSON, or null. */
  p2p: text("p2p", { mode: "json" }),
  lastSeen: integer("last_seen").notNull(),
  /** When the node unregistered (it is not scheduled until it reports again), or null. */
  leftAt: integer("left_at"),
});
