/**
 * Following a sandbox's log (`GET /v2/sandboxes/{id}/logs?cursor=<ms>&direction=forward`), for
 * the console's live tail and `agentenv sandbox logs --follow`. The API's cursor is inclusive
 * (entries at or after it, ordered by time then arrival), so the next page starts at the last
 * entry's time and skips the entries at that time already seen. Plain code: bundled into the
 * browser too.
 */

/** A log entry as the API answers it. */
export interface LogEntryBody {
  timestamp: string;
  level: string;
  message: string;
  fields: Record<string, string>;
}

/** Position in one sandbox's log. */
export class LogCursor {
  private at: number;
  /** Entries at exactly `at` already returned. */
  private seenAtLast = 0;

  /** @param from unix ms to start at (0: the beginning of the log). */
  constructor(from = 0) {
    this.at = from;
  }

  /** Query string of the next page (`limit` entries at most). */
  query(limit: number, extra: Record<string, string> = {}): string {
    return new URLSearchParams({ cursor: String(this.at), direction: "forward", limit: String(limit), ...extra }).toString();
  }

  /** Entries of a page that were not returned before; advances the cursor. */
  take(page: LogEntryBody[]): LogEntryBody[] {
    const out: LogEntryBody[] = [];
    let skip = this.seenAtLast;
    for (const e of page) {
      const t = Date.parse(e.timestamp);
      if (t === this.at && skip > 0) {
        skip--;
        continue;
      }
      if (t < this.at) continue;
      if (t > this.at) {
        this.at = t;
        this.seenAtLast = 0;
      }
      this.seenAtLast++;
      out.push(e);
    }
    return out;
  }
}
