/**
 * Customer secrets (src/secrets): one row per secret, its current value encrypted with the key
 * of `[secrets] key_path` (AES-256-GCM, never stored beside it). Times are unix milliseconds.
 */
import { blob, index, integer, sqliteTable, text } from "drizzle-orm/sqlite-core";

export const secrets = sqliteTable(
  "secrets",
  {
    /** `sec_` + TypeID suffix of a UUIDv7. */
    id: text("id").primaryKey(),
    /** Canonical (lower-case) name, unique. */
    name: text("name").notNull().unique(),
    /** Version of the current value (1 at create, +1 per update). */
    version: integer("version").notNull(),
    /** iv (12) | tag (16) | ciphertext of the current value. */
    sealed: blob("sealed", { mode: "buffer" }).notNull(),
    metadata: text("metadata", { mode: "json" }).$type<Record<string, string>>().notNull(),
    createdAt: integer("created_at").notNull(),
    updatedAt: integer("updated_at").notNull(),
  },
  (t) => [index("secrets_created_idx").on(t.createdAt, t.id)],
);
