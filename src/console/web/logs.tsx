/**
 * A sandbox's live log tail: lifecycle events, guest console lines and envd's own lines
 * (`GET /v2/sandboxes/{id}/logs`, followed with LogCursor every `[console] refresh_ms`), with a
 * level and text filter. At most MAX_LINES are kept on the page.
 */
import { useEffect, useRef, useState } from "preact/hooks";
import { LogCursor, type LogEntryBody } from "../log-cursor.ts";
import { api, settings } from "./api.ts";
import { when } from "./format.ts";
import { errorMessage } from "../../util/error.ts";

const MAX_LINES = 2000;
const PAGE = 1000;

export function LogTail({ id }: { id: string }) {
  const [lines, setLines] = useState<LogEntryBody[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [level, setLevel] = useState("debug");
  const [search, setSearch] = useState("");
  const [follow, setFollow] = useState(true);
  const box = useRef<HTMLDivElement>(null);
  useEffect(() => {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const cursor = new LogCursor();
    setLines([]);
    const tick = async () => {
      try {
        for (;;) {
          const q = cursor.query(PAGE, { level, ...(search ? { search } : {}) });
          const r = await api<{ logs: LogEntryBody[] }>(`/v2/sandboxes/${encodeURIComponent(id)}/logs?${q}`);
          if (stopped) return;
          const fresh = cursor.take(r.data.logs);
          if (fresh.length) setLines((old) => [...old, ...fresh].slice(-MAX_LINES));
          setError(null);
          if (r.data.logs.length < PAGE) break;
        }
      } catch (e) {
        if (!stopped) setError(errorMessage(e));
      }
      if (!stopped) timer = setTimeout(tick, settings.refreshMs);
    };
    void tick();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [id, level, search]);
  useEffect(() => {
    if (follow && box.current) box.current.scrollTop = box.current.scrollHeight;
  }, [lines, follow]);
  return (
    <div>
      <div class="toolbar">
        <label>
          level{" "}
          <select value={level} onChange={(e) => setLevel((e.target as HTMLSelectElement).value)}>
            {["debug", "info", "warn", "error"].map((l) => (
              <option value={l}>{l}</option>
            ))}
          </select>
        </label>
        <input aria-label="search logs" placeholder="search" value={search} onChange={(e) => setSearch((e.target as HTMLInputElement).value)} />
        <label>
          <input type="checkbox" checked={follow} onChange={(e) => setFollow((e.target as HTMLInputElement).checked)} /> follow
        </label>
      </div>
      {error && <p class="error">{error}</p>}
      <div class="logs" id="logs" ref={box}>
        {lines.map((l) => (
          <div class={`line ${l.level}`}>
            <span class="t">{when(l.timestamp)}</span> <span class="lvl">{l.level}</span> <span class="src">{l.fields.source ?? ""}</span> <span class="msg">{l.message}</span>
          </div>
        ))}
        {lines.length === 0 && <p class="muted">No log lines yet.</p>}
      </div>
    </div>
  );
}
