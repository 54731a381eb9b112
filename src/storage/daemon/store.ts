/**
 * The disk daemon's persistent record of its devices (SQLite, `<daemon dir>/daemon.db`): enough
 * for a restarted daemon to serve every device again or to clean it up. A row is written before
 * a device is announced and deleted after it is gone, so a crash at any point leaves at most a
 * row whose device is half made, which recovery cleans up.
 */
import { Database } from "bun:sqlite";
import { DiskError } from "./errors.ts";
import type { EngineName, FuseSpec, TargetSpec } from "./protocol.ts";

/** One device as persisted. */
export interface DeviceRow {
  devId: string;
  engine: EngineName;
  /** What the device serves. */
  target: TargetSpec;
  /** FUSE placement as requested. */
  fuse: FuseSpec;
  /** The path a VMM opens. */
  path: string;
  /** exclusive: one sandbox's disk; shared: refcounted read-only device; pool: pre-created, not handed out. */
  access: "exclusive" | "shared" | "pool";
  shareKey: string | null;
  refcount: number;
  /** Engine facts needed to recover or clean up (FUSE: mount points; ublk: device number). */
  engineState: Record<string, unknown>;
  /** Who else holds a copy of the FUSE connection: pid, its fd number, its start time (clock ticks since boot). */
  holder: { pid: number; fd: number; start: number } | null;
  /** ms since the epoch */
  createdAt: number;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS devices (
  dev_id TEXT PRIMARY KEY,
  engine TEXT NOT NULL,
  target TEXT NOT NULL,
  fuse TEXT NOT NULL,
  path TEXT NOT NULL,
  access TEXT NOT NULL,
  share_key TEXT UNIQUE,
  refcount INTEGER NOT NULL CHECK (refcount >= 0),
  engine_state TEXT NOT NULL,
  holder_pid INTEGER,
  holder_fd INTEGER,
  holder_start INTEGER,
  created_at INTEGER NOT NULL
)`;

interface Raw {
  dev_id: string;
  engine: string;
  target: string;
  fuse: string;
  path: string;
  access: string;
  share_key: string | null;
  refcount: number;
  engine_state: string;
  holder_pid: number | null;
  holder_fd: number | null;
  holder_start: number | null;
  created_at: number;
}

/** The device table. */
export class DeviceStore {
  #db: Database;

  /**
   * Open (creating) the database at `path` (":memory:" in tests).
   * @throws DiskError `disk.open_failed`
   */
  constructor(readonly path: string) {
    try {
      this.#db = new Database(path, { create: true, strict: true });
      this.#db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;");
      this.#db.exec(SCHEMA);
    } catch (e) {
      throw new DiskError("disk.open_failed", `cannot open the device database ${path}: ${(e as Error).message}`, { path });
    }
  }

  /** Every row, oldest first. */
  all(): DeviceRow[] {
    return this.#db.query<Raw, []>("SELECT * FROM devices ORDER BY created_at, dev_id").all().map(fromRaw);
  }

  get(devId: string): DeviceRow | null {
    const r = this.#db.query<Raw, [string]>("SELECT * FROM devices WHERE dev_id = ?").get(devId);
    return r ? fromRaw(r) : null;
  }

  /** Insert or replace a row. */
  put(d: DeviceRow): void {
    this.#db
      .query(`INSERT OR REPLACE INTO devices (dev_id, engine, target, fuse, path, access, share_key, refcount, engine_state, holder_pid, holder_fd, holder_start, created_at)
              VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
      .run(d.devId, d.engine, JSON.stringify(d.target), JSON.stringify(d.fuse), d.path, d.access, d.shareKey, d.refcount, JSON.stringify(d.engineState),
        d.holder?.pid ?? null, d.holder?.fd ?? null, d.holder?.start ?? null, d.createdAt);
  }

  delete(devId: string): void {
    this.#db.query("DELETE FROM devices WHERE dev_id = ?").run(devId);
  }

  close(): void {
    this.#db.close();
  }
}

function fromRaw(r: Raw): DeviceRow {
  return {
    devId: r.dev_id,
    engine: r.engine as EngineName,
    target: JSON.parse(r.target) as TargetSpec,
    fuse: JSON.parse(r.fuse) as FuseSpec,
    path: r.path,
    access: r.access as DeviceRow["access"],
    shareKey: r.share_key,
    refcount: r.refcount,
    engineState: JSON.parse(r.engine_state) as Record<string, unknown>,
    holder: r.holder_pid !== null && r.holder_fd !== null ? { pid: r.holder_pid, fd: r.holder_fd, start: r.holder_start ?? 0 } : null,
    createdAt: r.created_at,
  };
}
