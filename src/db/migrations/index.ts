/**
 * Embedded migrations, in order. Each entry is a file drizzle-kit generated; statements are
 * separated by drizzle's `--> statement-breakpoint` marker. Append only; never edit a shipped one.
 */
export interface Migration {
  tag: string;
  sql: string;
}

export const MIGRATIONS: Migration[] = [];
