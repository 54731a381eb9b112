/**
 * `agentenv events [--sandbox ID] [--follow]`: a node's (or the gateway's) lifecycle events, one
 * line each, oldest first: time, sandbox, type and what the event says (reason, kind, error...).
 * Without --follow the newest `--limit` events are shown; with it, those and then every new event
 * as it is recorded (the feed `GET /events/sandboxes?cursor=`, polled every `--interval` ms) until
 * interrupted. Node URL and key as for `agentenv sandbox` (--url, --key, AENV_API_URL, ...).
 */
import { defineCommand } from "citty";
import { call, CliError, common, conn, run, type Conn } from "./node-client.ts";

interface Event {
  id: string;
  type: string;
  timestamp: string;
  sandboxId: string;
  eventData: Record<string, unknown> | null;
}

/** The words of an event's data worth a line: reasons, kinds, errors, sources, timeouts. */
function details(e: Event): string {
  const d = e.eventData ?? {};
  const out: string[] = [];
  for (const k of ["kill_reason", "pause_reason", "snapshot_kind", "source_sandbox_id", "snapshot_id", "set_timeout", "error"]) {
    if (d[k] !== undefined) out.push(`${k}=${typeof d[k] === "string" ? d[k] : JSON.stringify(d[k])}`);
  }
  if (d.network_egress !== undefined) out.push(`network_egress=${JSON.stringify(d.network_egress)}`);
  const ex = d.execution as { execution_time?: number } | undefined;
  if (ex?.execution_time !== undefined) out.push(`ran=${(ex.execution_time / 1000).toFixed(1)}s`);
  return out.join(" ");
}

/** One output line of `e`. */
export function eventLine(e: Event): string {
  return `${e.timestamp}  ${e.sandboxId}  ${e.type.replace(/^sandbox\.lifecycle\./, "").padEnd(12)}  ${details(e)}`.trimEnd();
}

function positive(v: string | undefined, name: string, def: number, max: number): number {
  if (v === undefined) return def;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > max) throw new CliError(`--${name} must be an integer between 1 and ${max}, got ${v}`);
  return n;
}

/** Print events after `cursor` of the node-wide feed (of `sandbox` only when given), forever. */
async function follow(c: Conn, cursor: string, sandbox: string | undefined, intervalMs: number, print: (e: Event) => void): Promise<never> {
  for (;;) {
    const r = await call(c, "GET", `/events/sandboxes?cursor=${encodeURIComponent(cursor)}&limit=100`);
    const page = r.data as Event[];
    for (const e of page) if (!sandbox || e.sandboxId === sandbox) print(e);
    cursor = r.headers.get("x-next-cursor") ?? cursor;
    if (page.length < 100) await Bun.sleep(intervalMs);
  }
}

export default defineCommand({
  meta: { name: "events", description: "show sandbox lifecycle events; --follow prints new ones as they happen" },
  args: {
    ...common,
    sandbox: { type: "string", description: "only this sandbox's events" },
    follow: { type: "boolean", alias: "f", description: "keep printing new events until interrupted" },
    limit: { type: "string", description: "how many of the newest events to show first (1..100, default 20)" },
    interval: { type: "string", description: "with --follow: poll period in ms (default 1000)" },
    json: { type: "boolean", description: "one JSON event per line" },
  },
  run: ({ args }) =>
    run(async () => {
      const c = conn(args);
      const limit = positive(args.limit, "limit", 20, 100);
      const intervalMs = positive(args.interval, "interval", 1000, 3_600_000);
      const print = (e: Event) => console.log(args.json ? JSON.stringify(e) : eventLine(e));
      // the cursor is taken first: an event recorded between the two requests is printed by the feed
      const head = await call(c, "GET", "/events/sandboxes?limit=1");
      const cursor = head.headers.get("x-next-cursor") ?? "";
      let recent: Event[] = [];
      if (args.sandbox) {
        const r = await fetchSandbox(c, args.sandbox, limit, !!args.follow);
        recent = r;
      } else {
        recent = (await call(c, "GET", `/events/sandboxes?limit=${limit}`)).data as Event[];
      }
      const shown = new Set<string>();
      for (const e of [...recent].reverse()) (shown.add(e.id), print(e));
      if (!args.follow) {
        if (recent.length === 0 && !args.json) console.error(args.sandbox ? `no events of sandbox ${args.sandbox}` : "no events");
        return;
      }
      await follow(c, cursor, args.sandbox, intervalMs, (e) => {
        if (!shown.has(e.id)) print(e);
        shown.delete(e.id);
      });
    }),
});

/** The newest `limit` events of `sandbox`; none (not an error) when following a sandbox with no event yet. */
async function fetchSandbox(c: Conn, sandbox: string, limit: number, following: boolean): Promise<Event[]> {
  try {
    return (await call(c, "GET", `/events/sandboxes/${encodeURIComponent(sandbox)}?limit=${limit}`)).data as Event[];
  } catch (e) {
    if (following && e instanceof CliError && / 404 /.test(e.message)) return [];
    throw e;
  }
}
