/**
 * Build logs: one JSON-lines file per build (`$home/catalog/logs/<buildID>.jsonl`), at most
 * `maxBytes` each (then one truncation line; later lines are dropped except errors, so a failed
 * build still ends with its reason), read by entry offset through an in-memory index of line
 * starts (the SDK polls `status?logsOffset=` every 200 ms while a build runs: each poll reads only
 * the new lines, never the whole file). The index of a build is made by one scan of its file on
 * first use after a start and kept for the `maxIndexed` builds used last. A file is read as it
 * comes from disk, not trusted: the scan goes through it in fixed-size pieces (memory does not
 * follow its size), and a line that is not an entry (a torn last line after a crash mid-append,
 * bytes another process wrote, a line longer than `maxBytes`) is skipped, not an error.
 */
import { type Static, Type as T } from "@sinclair/typebox";
import { appendFileSync, closeSync, mkdirSync, openSync, readSync, rmSync } from "node:fs";
import { join } from "node:path";
import { jsonSchema } from "../util/json-check.ts";
import { LruMap } from "../util/lru.ts";

const LEVEL = T.Union([T.Literal("debug"), T.Literal("info"), T.Literal("warn"), T.Literal("error")]);
/** Log levels of build log entries. */
export type LogLevel = Static<typeof LEVEL>;

const ENTRY = jsonSchema(
  T.Object({
    /** RFC 3339. */
    timestamp: T.String(),
    level: LEVEL,
    message: T.String(),
    step: T.Optional(T.String()),
  }),
);
/** One build log line. `step` is "base", "<n>" (1-based) or "finalize" as E2B numbers them. */
export type BuildLogEntry = Static<typeof ENTRY.schema>;

/** Bytes the index scan reads from a log file at a time. */
const SCAN_BYTES = 64 * 1024;

/** Most recent error entries kept per build for a failed build's reason. */
const ERROR_TAIL = 20;

interface LogIndex {
  /** Byte offset of each complete entry's line. */
  starts: number[];
  /** File size after the last complete line (the next entry starts here). */
  end: number;
  truncated: boolean;
  errors: BuildLogEntry[];
}

const BUILD_ID_RE = /^[0-9a-f-]{36}$/;

/** A line as an entry, or undefined when it is not one (a torn line, foreign bytes). */
function parse(line: string): BuildLogEntry | undefined {
  const r = ENTRY.parse(line);
  return r.ok ? r.value : undefined;
}

/**
 * Call `onLine(text, start)` for every complete line of file `p` (without its newline; `start` =
 * its byte offset), reading `SCAN_BYTES` at a time; lines longer than `maxLine` bytes are passed
 * over. @returns the file's size and the offset after its last newline, or null when the file is
 * missing or cannot be read (a log is never worth failing a status for).
 */
function scanLines(p: string, maxLine: number, onLine: (text: string, start: number) => void): { size: number; end: number } | null {
  let fd: number;
  try {
    fd = openSync(p, "r");
  } catch {
    return null;
  }
  try {
    const buf = Buffer.alloc(SCAN_BYTES);
    /** The current line's bytes from earlier pieces, or null once it is known to be too long. */
    let carry: Buffer[] | null = [];
    let carried = 0;
    let lineStart = 0;
    let at = 0;
    for (;;) {
      const n = readSync(fd, buf, 0, SCAN_BYTES, at);
      if (n === 0) return { size: at, end: lineStart };
      let from = 0;
      for (let nl = buf.indexOf(0x0a, from); nl >= 0 && nl < n; nl = buf.indexOf(0x0a, from)) {
        if (carry !== null && carried + nl - from <= maxLine) onLine(Buffer.concat([...carry, buf.subarray(from, nl)]).toString("utf8"), lineStart);
        carry = [];
        carried = 0;
        from = nl + 1;
        lineStart = at + from;
      }
      if (carry !== null && n > from) {
        carried += n - from;
        carry = carried <= maxLine ? [...carry, Buffer.from(buf.subarray(from, n))] : null;
      }
      at += n;
    }
  } catch {
    return null;
  } finally {
    closeSync(fd);
  }
}

/** The build logs of one catalog directory. */
export class BuildLogs {
  private readonly index: LruMap<string, LogIndex>;

  /**
   * @param dir directory of the `.jsonl` files.
   * @param maxBytes size bound of one build's log (bytes).
   * @param maxIndexed builds whose line index stays in memory.
   */
  constructor(readonly dir: string, private readonly maxBytes: number, maxIndexed = 32) {
    this.index = new LruMap(maxIndexed);
    mkdirSync(dir, { recursive: true });
  }

  /**
   * Append entries; past `maxBytes` one truncation line is written and only `error` entries after
   * it. @throws the file system's error (ENOSPC, EIO): the caller decides what a lost line means.
   */
  append(buildID: string, entries: BuildLogEntry[]): void {
    if (!BUILD_ID_RE.test(buildID) || entries.length === 0) return;
    const ix = this.indexOf(buildID);
    let text = "";
    const starts: number[] = [];
    const errors: BuildLogEntry[] = [];
    let at = ix.end;
    const put = (e: BuildLogEntry) => {
      const line = JSON.stringify(e) + "\n";
      starts.push(at);
      at += Buffer.byteLength(line);
      text += line;
      if (e.level === "error") errors.push(e);
    };
    let truncated = ix.truncated;
    for (const e of entries) {
      if (!truncated && at + Buffer.byteLength(JSON.stringify(e)) + 1 > this.maxBytes) {
        truncated = true;
        put({ timestamp: e.timestamp, level: "warn", message: `log truncated: more than ${this.maxBytes} bytes ([template_build] log_max_bytes); only errors follow`, ...(e.step ? { step: e.step } : {}) });
      }
      if (!truncated || e.level === "error") put(e);
    }
    if (!text) return;
    appendFileSync(this.path(buildID), text);
    ix.starts.push(...starts);
    ix.end = at;
    ix.truncated = truncated;
    ix.errors = [...ix.errors, ...errors].slice(-ERROR_TAIL);
  }

  /** Entries `[offset, offset + limit)` in order ([] past the end). */
  read(buildID: string, offset: number, limit: number): BuildLogEntry[] {
    if (!BUILD_ID_RE.test(buildID) || limit <= 0) return [];
    const ix = this.indexOf(buildID);
    if (offset >= ix.starts.length) return [];
    const from = ix.starts[offset]!;
    const to = offset + limit < ix.starts.length ? ix.starts[offset + limit]! : ix.end;
    const buf = Buffer.alloc(to - from);
    let fd: number;
    try {
      fd = openSync(this.path(buildID), "r");
    } catch {
      return []; // the log cannot be read (lost with a full disk): no lines, not a failed status
    }
    try {
      readSync(fd, buf, 0, buf.length, from);
    } finally {
      closeSync(fd);
    }
    // the indexed lines only (a line the index passed over, e.g. one too long, is not an entry)
    const out: BuildLogEntry[] = [];
    const end = Math.min(offset + limit, ix.starts.length);
    for (let k = offset; k < end; k++) {
      const at = ix.starts[k]! - from;
      const nl = buf.indexOf(0x0a, at);
      const e = parse(buf.toString("utf8", at, nl < 0 ? buf.length : nl));
      if (e) out.push(e);
    }
    return out;
  }

  /** Every entry (for filters by time or level; bounded by `maxBytes`). */
  all(buildID: string): BuildLogEntry[] {
    return this.read(buildID, 0, Number.MAX_SAFE_INTEGER);
  }

  /** Number of entries. */
  count(buildID: string): number {
    return BUILD_ID_RE.test(buildID) ? this.indexOf(buildID).starts.length : 0;
  }

  /** The last error entries (at most 20), oldest first. */
  errors(buildID: string): BuildLogEntry[] {
    return BUILD_ID_RE.test(buildID) ? [...this.indexOf(buildID).errors] : [];
  }

  /** Delete a build's log. */
  remove(buildID: string): void {
    this.index.delete(buildID);
    if (BUILD_ID_RE.test(buildID)) rmSync(this.path(buildID), { force: true });
  }

  private path(buildID: string): string {
    return join(this.dir, `${buildID}.jsonl`);
  }

  /** The build's index, made by one scan of its file when not in memory. */
  private indexOf(buildID: string): LogIndex {
    let ix = this.index.get(buildID);
    if (ix) return ix;
    ix = { starts: [], end: 0, truncated: false, errors: [] };
    const p = this.path(buildID);
    const scanned = scanLines(p, this.maxBytes, (text, start) => {
      const e = parse(text);
      if (!e) return;
      ix.starts.push(start);
      if (e.level === "error") ix.errors = [...ix.errors, e].slice(-ERROR_TAIL);
      if (e.level === "warn" && e.message.startsWith("log truncated:")) ix.truncated = true;
    });
    if (scanned) {
      ix.end = scanned.size;
      // a torn last line (a crash mid-append) is ended so the next entry starts on its own line
      if (scanned.end < scanned.size) {
        appendFileSync(p, "\n");
        ix.end += 1;
      }
    }
    this.index.set(buildID, ix);
    return ix;
  }
}
