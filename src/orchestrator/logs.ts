/**
 * Sandbox logs: lifecycle events the orchestrator records and the lines a runtime hands over
 * (guest console, envd), kept in the node database (table `sandbox_logs`) so they survive a pause
 * and a node restart. Lines are buffered and written in one transaction per `flushIntervalMs`;
 * every bound is explicit: message length, pending lines, entries per sandbox.
 */
import type { Logger } from "pino";
import type { Db } from "../db/index.ts";
import { Type as T } from "@sinclair/typebox";
import { jsonSchema } from "../util/json-check.ts";
import { LOG_LEVELS, type LogLevel, type SandboxLogEntry, type SandboxLogQuery } from "./types.ts";

/** An entry's fields as stored (JSON text); a value that is not a string map reads as none. */
const FIELDS = jsonSchema(T.Record(T.String(), T.String()));
function storedFields(text: string): Record<string, string> {
  const r = FIELDS.parse(text);
  return r.ok ? r.value : {};
}

/** Settings of the store (`[logs]`). */
export interface LogStoreOptions {
  maxEntriesPerSandbox: number;
  maxLineBytes: number;
  flushIntervalMs: number;
  maxPendingLines: number;
}

interface Pending {
  id: string;
  e: SandboxLogEntry;
}

interface Row {
  at: number;
  level: number;
  source: string;
  message: string;
  fields: string;
}

const enc = new TextEncoder();
const dec = new TextDecoder();

/**
 * Cut `text` into pieces of at most `max` UTF-8 bytes, never inside a character.
 * @returns at least one piece ("" stays one empty piece)
 */
export function splitUtf8(text: string, max: number): string[] {
  const bytes = enc.encode(text);
  if (bytes.length <= max) return [text];
  const out: string[] = [];
  let i = 0;
  while (i < bytes.length) {
    let end = Math.min(bytes.length, i + max);
    // back off continuation bytes (10xxxxxx) so a piece never ends mid-character
    if (end < bytes.length) while (end > i && (bytes[end]! & 0xc0) === 0x80) end--;
    if (end === i) end = Math.min(bytes.length, i + max);
    out.push(dec.decode(bytes.subarray(i, end)));
    i = end;
  }
  return out;
}

/** Rank of a level (0 debug .. 3 error). */
export function levelRank(l: LogLevel): number {
  return LOG_LEVELS.indexOf(l);
}

export class SandboxLogStore {
  private pending: Pending[] = [];
  /** Lines dropped per sandbox because `maxPendingLines` was reached; reported at the next flush. */
  private readonly dropped = new Map<string, number>();
  private timer: ReturnType<typeof setInterval> | undefined;

  constructor(
    private readonly db: Db,
    private readonly opts: LogStoreOptions,
    private readonly log: Logger,
  ) {}

  /** Start the periodic flush. */
  start(): void {
    this.timer ??= setInterval(() => this.flushSafely(), this.opts.flushIntervalMs);
  }

  /** Stop the periodic flush and write what is pending. */
  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.flushSafely();
  }

  /**
   * Queue an entry of sandbox `id`. A message longer than `maxLineBytes` becomes several entries.
   * Beyond `maxPendingLines` waiting lines the oldest waiting line is dropped (counted, reported).
   */
  append(id: string, e: SandboxLogEntry): void {
    for (const message of splitUtf8(e.message, this.opts.maxLineBytes)) {
      if (this.pending.length >= this.opts.maxPendingLines) {
        const gone = this.pending.shift()!;
        this.dropped.set(gone.id, (this.dropped.get(gone.id) ?? 0) + 1);
      }
      this.pending.push({ id, e: { ...e, message } });
    }
  }

  /**
   * Write pending entries (one transaction), then trim each touched sandbox to
   * `maxEntriesPerSandbox`.
   * @throws the database error (entries stay pending for the next try)
   */
  flush(): void {
    if (this.pending.length === 0 && this.dropped.size === 0) return;
    const batch = this.pending;
    const dropped = [...this.dropped];
    const insert = this.db.sqlite.query("INSERT INTO sandbox_logs (sandbox_id, at, level, source, message, fields) VALUES (?, ?, ?, ?, ?, ?)");
    const trim = this.db.sqlite.query(
      "DELETE FROM sandbox_logs WHERE sandbox_id = ?1 AND seq <= (SELECT seq FROM sandbox_logs WHERE sandbox_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
    );
    this.db.sqlite.transaction(() => {
      const touched = new Set<string>();
      for (const [id, n] of dropped) {
        const at = batch.find((p) => p.id === id)?.e.at ?? Date.now();
        insert.run(id, at, levelRank("warn"), "lifecycle", `${n} log lines dropped: the node could not store them fast enough`, "{}");
        touched.add(id);
      }
      for (const { id, e } of batch) {
        insert.run(id, e.at, levelRank(e.level), e.source, e.message, JSON.stringify(e.fields));
        touched.add(id);
      }
      for (const id of touched) trim.run(id, this.opts.maxEntriesPerSandbox);
    })();
    this.pending = [];
    this.dropped.clear();
  }

  /** Entries of sandbox `id` matching `q` (pending ones included), in the query's direction. */
  query(id: string, q: SandboxLogQuery): SandboxLogEntry[] {
    this.flushSafely();
    const forward = q.direction === "forward";
    const cursor = q.cursor ?? (forward ? 0 : Number.MAX_SAFE_INTEGER);
    const conds = ["sandbox_id = ?1", forward ? "at >= ?2" : "at <= ?2", "level >= ?3"];
    if (q.search) conds.push("instr(message, ?4) > 0");
    const order = forward ? "ASC" : "DESC";
    const sql = `SELECT at, level, source, message, fields FROM sandbox_logs WHERE ${conds.join(" AND ")} ORDER BY at ${order}, seq ${order} LIMIT ?5`;
    const rows = this.db.sqlite.query<Row, (string | number)[]>(sql).all(id, cursor, q.level ? levelRank(q.level) : 0, q.search ?? "", q.limit);
    return rows.map((r) => ({ at: r.at, level: LOG_LEVELS[r.level] ?? "info", source: r.source as SandboxLogEntry["source"], message: r.message, fields: storedFields(r.fields) }));
  }

  /** Delete the entries of sandboxes that no longer have a record (after the orchestrator pruned them). */
  pruneOrphans(): number {
    this.flushSafely();
    return this.db.sqlite.query("DELETE FROM sandbox_logs WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)").run().changes;
  }

  private flushSafely(): void {
    try {
      this.flush();
    } catch (e) {
      this.log.error({ err: e, pending: this.pending.length }, "writing sandbox logs failed");
    }
  }
}
