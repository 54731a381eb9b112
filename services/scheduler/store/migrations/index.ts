/**
 * Embedded migrations of the scheduler database, in order (drizzle-kit output from
 * ../schema.ts; statements split on `--> statement-breakpoint`). Append only.
 */
import type { Migration } from "../../../../src/db/migrations/index.ts";
import init from "./scheduler_0001_init.sql" with { type: "text" };
import nodeLeft from "./scheduler_0002_node_left.sql" with { type: "text" };
import bindingHeld from "./scheduler_0003_binding_held.sql" with { type: "text" };

export const SCHEDULER_MIGRATIONS: Migration[] = [
  { tag: "scheduler_0001_init", sql: init },
  { tag: "scheduler_0002_node_left", sql: nodeLeft },
  { tag: "scheduler_0003_binding_held", sql: bindingHeld },
];
