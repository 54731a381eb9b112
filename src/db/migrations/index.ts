/**
 * Embedded migrations, in order. Each entry is a file drizzle-kit generated; statements are
 * separated by drizzle's `--> statement-breakpoint` marker. Append only; never edit a shipped one.
 */
import sandboxes0001 from "./sandboxes_0001_init.sql" with { type: "text" };
import net0001 from "./net_0001_slots.sql" with { type: "text" };
import sandboxes0002 from "./sandboxes_0002_template_spawns.sql" with { type: "text" };
import sandboxes0003 from "./sandboxes_0003_logs.sql" with { type: "text" };
import sandboxes0004 from "./sandboxes_0004_volumes.sql" with { type: "text" };
import sandboxes0005 from "./sandboxes_0005_fs_snapshots.sql" with { type: "text" };
import events0001 from "./events_0001_init.sql" with { type: "text" };
import secrets0001 from "./secrets_0001_init.sql" with { type: "text" };

export interface Migration {
  tag: string;
  sql: string;
}

export const MIGRATIONS: Migration[] = [
  { tag: "sandboxes_0001_init", sql: sandboxes0001 },
  { tag: "net_0001_slots", sql: net0001 },
  { tag: "sandboxes_0002_template_spawns", sql: sandboxes0002 },
  { tag: "sandboxes_0003_logs", sql: sandboxes0003 },
  { tag: "sandboxes_0004_volumes", sql: sandboxes0004 },
  { tag: "sandboxes_0005_fs_snapshots", sql: sandboxes0005 },
  { tag: "events_0001_init", sql: events0001 },
  { tag: "secrets_0001_init", sql: secrets0001 },
];

/** The migrations of the secrets table alone (the gateway's own secrets database). */
export const SECRETS_MIGRATIONS: Migration[] = MIGRATIONS.filter((m) => m.tag.startsWith("secrets_"));
