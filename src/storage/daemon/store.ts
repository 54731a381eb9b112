/**
 * The disk daemon's persistent record of its devices (SQLite, `<daemon dir>/daemon.db`): enough
 * for a restarted daemon to serve every device again or to clean it up. A row is written before
 * a device is announced and deleted after it is gone, so a crash at any point leaves at most a
 * row whose device is half made, which recovery cleans up.
 */
import { Database } from "bun:sqlite";
import type { Static, TSchema } from "@sinclair/typebox";
import { describeProblem, type JsonSchema } from "../../util/json-check.ts";
import { DiskError } from "../errors.ts";
import { PERSISTED } from "./messages.ts";
import type { EngineName, FuseSpec, TargetSpec } from "./protocol.ts";
import { errorMessage } from "../../util/error.ts";

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
      throw new DiskError("disk.open_failed", `cannot open the device database ${path}: ${errorMessage(e)}`, { path });
    }
  }

  /**
   * Every row, oldest first, and the rows that cannot be read back (a damaged database, another
   * version's record): those are named with what is wrong, for the caller to clean up.
   */
  all(): { rows: DeviceRow[]; corrupt: CorruptRow[] } {
    const rows: DeviceRow[] = [];
    const corrupt: CorruptRow[] = [];
    for (const r of this.#db.query<Raw, []>("SELECT * FROM devices ORDER BY created_at, dev_id").all()) {
      const d = fromRaw(r);
      if ("problem" in d) corrupt.push(d);
      else rows.push(d);
    }
    return { rows, corrupt };
  }

  /** One row. @throws DiskError `disk.bad_spec` when it cannot be read back (the problem named). */
  get(devId: string): DeviceRow | null {
    const r = this.#db.query<Raw, [string]>("SELECT * FROM devices WHERE dev_id = ?").get(devId);
    if (!r) return null;
    const d = fromRaw(r);
    if ("problem" in d) throw new DiskError("disk.bad_spec", `the record of device ${devId} is corrupt: ${d.problem}`, { devId });
    return d;
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

/** A persisted row that does not read back as a device. */
export interface CorruptRow {
  devId: string;
  problem: string;
}

/** A JSON column checked against `schema`, or what is wrong with it. */
function column<S extends TSchema>(name: string, text: string, schema: JsonSchema<S>): { value: Static<S> } | { problem: string } {
  const r = schema.parse(text);
  return r.ok ? { value: r.value } : { problem: `${name} ${describeProblem(r.problem)}` };
}

function fromRaw(r: Raw): DeviceRow | CorruptRow {
  const bad = (problem: string): CorruptRow => ({ devId: r.dev_id, problem });
  const engine = PERSISTED.engine.check(r.engine);
  if (!engine.ok) return bad(`engine ${JSON.stringify(r.engine)} is not fuse or ublk`);
  const access = PERSISTED.access.check(r.access);
  if (!access.ok) return bad(`access ${JSON.stringify(r.access)} is not exclusive, shared or pool`);
  const target = column("target", r.target, PERSISTED.target);
  if ("problem" in target) return bad(target.problem);
  const fuse = column("fuse", r.fuse, PERSISTED.fuse);
  if ("problem" in fuse) return bad(fuse.problem);
  const engineState = column("engine_state", r.engine_state, PERSISTED.engineState);
  if ("problem" in engineState) return bad(engineState.problem);
  return {
    devId: r.dev_id,
    engine: engine.value,
    target: target.value,
    fuse: fuse.value,
    path: r.path,
    access: access.value,
    shareKey: r.share_key,
    refcount: r.refcount,
    engineState: engineState.value,
    holder: r.holder_pid !== null && r.holder_fd !== null ? { pid: r.holder_pid, fd: r.holder_fd, start: r.holder_start ?? 0 } : null,
    createdAt: r.created_at,
  };
}
