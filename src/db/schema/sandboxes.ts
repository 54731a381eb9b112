/**
 * The `sandboxes` table, owned by the orchestrator: one row per sandbox the node has ever
 * created (killed rows are kept for a while for diagnostics and pruned by the orchestrator).
 * Times are unix milliseconds. JSON columns hold plain data (see src/orchestrator/types.ts).
 */
import { index, integer, sqliteTable, text } from "drizzle-orm/sqlite-core";

export const sandboxes = sqliteTable(
  "sandboxes",
  {
    id: text("id").primaryKey(),
    templateId: text("template_id").notNull(),
    alias: text("alias"),
    /** One of SANDBOX_STATES (src/orchestrator/states.ts). */
    state: text("state").notNull(),
    cpuCount: integer("cpu_count").notNull(),
    memoryMB: integer("memory_mb").notNull(),
    diskSizeMB: integer("disk_size_mb").notNull(),
    envdVersion: text("envd_version").notNull(),
    envdAccessToken: text("envd_access_token"),
    trafficAccessToken: text("traffic_access_token"),
    metadata: text("metadata", { mode: "json" }).$type<Record<string, string>>().notNull(),
    envVars: text("env_vars", { mode: "json" }).$type<Record<string, string>>().notNull(),
    autoPause: integer("auto_pause", { mode: "boolean" }).notNull(),
    autoPauseMemory: integer("auto_pause_memory", { mode: "boolean" }).notNull().default(true),
    /** "memory" | "filesystem" while paused, else null. */
    snapshotKind: text("snapshot_kind").$type<"memory" | "filesystem">(),
    autoResume: integer("auto_resume", { mode: "boolean" }).notNull(),
    allowInternetAccess: integer("allow_internet_access", { mode: "boolean" }),
    network: text("network", { mode: "json" }).$type<Record<string, unknown>>(),
    /** Volumes mounted in the guest: [{volumeId, name, path, readOnly}] in drive order. */
    volumeMounts: text("volume_mounts", { mode: "json" }).$type<{ volumeId: string; name: string; path: string; readOnly: boolean }[]>().notNull().default([]),
    /** Where the sandbox's ports are reachable from the host: {host, ports?{guest: host}}. */
    endpoint: text("endpoint", { mode: "json" }).$type<{ host: string; ports?: Record<string, number> }>(),
    /** Runtime-owned opaque state (VMM pid, slot, work dir, snapshot files). */
    runtimeState: text("runtime_state", { mode: "json" }).$type<unknown>(),
    error: text("error"),
    createdAt: integer("created_at").notNull(),
    startedAt: integer("started_at").notNull(),
    endAt: integer("end_at").notNull(),
    updatedAt: integer("updated_at").notNull(),
  },
  (t) => [index("sandboxes_state_idx").on(t.state), index("sandboxes_started_idx").on(t.startedAt)],
);

/**
 * Per-template spawn statistics (E2B `Template.spawnCount` / `lastSpawnedAt`), owned by the
 * orchestrator: bumped once per sandbox created (running) from the template; unix ms.
 */
export const templateSpawns = sqliteTable("template_spawns", {
  templateId: text("template_id").primaryKey(),
  spawnCount: integer("spawn_count").notNull(),
  lastSpawnedAt: integer("last_spawned_at").notNull(),
});

/**
 * Sandbox log entries, owned by the orchestrator (src/orchestrator/logs.ts): lifecycle events,
 * guest console and envd lines; `seq` orders entries written at the same ms. Bounded per sandbox
 * (`[logs] max_entries_per_sandbox`, oldest deleted first); deleted with the sandbox's record.
 * `level` is the index in LOG_LEVELS (0 debug .. 3 error); `fields` a JSON object of strings.
 */
export const sandboxLogs = sqliteTable(
  "sandbox_logs",
  {
    seq: integer("seq").primaryKey({ autoIncrement: true }),
    sandboxId: text("sandbox_id").notNull(),
    at: integer("at").notNull(),
    level: integer("level").notNull(),
    source: text("source").notNull(),
    message: text("message").notNull(),
    fields: text("fields", { mode: "json" }).$type<Record<string, string>>().notNull(),
  },
  (t) => [index("sandbox_logs_at_idx").on(t.sandboxId, t.at), index("sandbox_logs_seq_idx").on(t.sandboxId, t.seq)],
);

/**
 * Volumes, owned by the orchestrator (src/orchestrator/volumes.ts): persistent ext4-in-overlaybd
 * disks under `$home_path/volumes/<id>/`. Which sandboxes hold a volume is read from the
 * sandboxes' `volume_mounts`, never stored twice.
 */
export const volumes = sqliteTable("volumes", {
  id: text("id").primaryKey(),
  name: text("name").notNull().unique(),
  token: text("token").notNull(),
  sizeBytes: integer("size_bytes").notNull(),
  createdAt: integer("created_at").notNull(),
});
