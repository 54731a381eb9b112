/**
 * Build logs: one JSON-lines file per build (`$home/catalog/logs/<buildID>.jsonl`), at most
 * `maxBytes` each (then one truncation line; later lines are dropped except errors, so a failed
 * build still ends with its reason), read by entry offset through an in-memory index of line
 * starts (the SDK polls `status?logsOffset=` every 200 ms while a build runs: each poll reads only
 * the new lines, never the whole file). The index of a build is made by one scan of its file on
 * first use after a start and kept for the `maxIndexed` builds used last. A torn last line (a
 * crash mid-append) is skipped, not an error.
 */
import { appendFileSync, closeSync, mkdirSync, openSync, readFileSync, readSync, rmSync } from "node:fs";
import { join } from "node:path";

/** Log levels of build log entries. */
export type LogLevel = "debug" | "info" | "warn" | "error";

/** One build log line. `step` is "base", "<n>" (1-based) or "finalize" as E2B numbers them. */
export interface BuildLogEntry {
  /** RFC 3339. */
  timestamp: string;
  level: LogLevel;
  message: string;
  step?: string;
}

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

function parse(line: string): BuildLogEntry | undefined {
  try {
    const e = JSON.parse(line) as BuildLogEntry;
    return typeof e?.message === "string" ? e : undefined;
  } catch {
    return undefined; // a torn line
  }
}

/** A file's bytes, or null when it is missing or cannot be read (a log is never worth failing a status for). */
function readOrNull(p: string): Buffer | null {
  try {
    return readFileSync(p);
  } catch {
    return null;
  }
}

/** The build logs of one catalog directory. */
export class BuildLogs {
  private readonly index = new Map<string, LogIndex>();

  /**
   * @param dir directory of the `.jsonl` files.
   * @param maxBytes size bound of one build's log (bytes).
   * @param maxIndexed builds whose line index stays in memory.
   */
  constructor(readonly dir: string, private readonly maxBytes: number, private readonly maxIndexed = 32) {
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
    return buf.toString("utf8").split("\n").filter((l) => l.length > 0).map(parse).filter((e): e is BuildLogEntry => e !== undefined);
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
    if (ix) {
      // most recently used last
      this.index.delete(buildID);
      this.index.set(buildID, ix);
      return ix;
    }
    ix = { starts: [], end: 0, truncated: false, errors: [] };
    const p = this.path(buildID);
    const buf = readOrNull(p);
    if (buf) {
      let at = 0;
      for (let nl = buf.indexOf(0x0a, at); nl >= 0; at = nl + 1, nl = buf.indexOf(0x0a, at)) {
        const e = parse(buf.toString("utf8", at, nl));
        if (!e) continue;
        ix.starts.push(at);
        if (e.level === "error") ix.errors = [...ix.errors, e].slice(-ERROR_TAIL);
        if (e.level === "warn" && e.message.startsWith("log truncated:")) ix.truncated = true;
      }
      ix.end = buf.length;
      // a torn last line (a crash mid-append) is ended so the next entry starts on its own line
      if (at < buf.length) {
        appendFileSync(p, "\n");
        ix.end += 1;
      }
    }
    this.index.set(buildID, ix);
    while (this.index.size > this.maxIndexed) this.index.delete(this.index.keys().next().value!);
    return ix;
  }
}
