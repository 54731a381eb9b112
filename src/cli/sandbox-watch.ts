/**
 * `agentenv sandbox logs ID [--follow]` and `agentenv sandbox metrics ID [--follow]`: a
 * sandbox's log (`GET /v2/sandboxes/{id}/logs`: lifecycle, guest console, envd) and its resource
 * samples (`GET /sandboxes/{id}/metrics`), printed as a table or, with `--json`, as JSON (a list;
 * with `--follow`, one object per line). `--follow` polls every `--interval` ms and stops when
 * the sandbox is gone (or on Ctrl-C).
 */
import { defineCommand } from "citty";
import { LogCursor, type LogEntryBody } from "../console/index.ts";
import { call, CliError, common, conn, run, type Conn } from "./node-client.ts";

const LOG_PAGE = 1000;

/** A metrics sample as the API answers it. */
interface MetricBody {
  timestamp: string;
  timestampUnix: number;
  cpuCount: number;
  cpuUsedPct: number;
  memUsed: number;
  memTotal: number;
  diskUsed: number;
  diskTotal: number;
}

const watchArgs = {
  ...common,
  id: { type: "positional", required: true, description: "sandbox id" },
  follow: { type: "boolean", alias: "f", description: "keep printing new entries until the sandbox is gone" },
  interval: { type: "string", default: "1000", description: "poll interval with --follow, ms" },
  json: { type: "boolean", description: "JSON output (with --follow: one object per line)" },
} as const;

function interval(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 50 || n > 3_600_000) throw new CliError(`--interval must be 50..3600000 ms, got ${v}`);
  return n;
}

/** "2026-01-02 03:04:05.678" of an RFC 3339 time. */
const clock = (iso: string) => iso.replace("T", " ").replace("Z", "").slice(0, 23);
const mib = (n: number) => `${(n / 1048576).toFixed(0)} MiB`;

/** The next page of `id`'s log after `cursor` (all pages until one is short). @returns null when the sandbox is gone. */
async function nextLogs(c: Conn, id: string, cursor: LogCursor, extra: Record<string, string>): Promise<LogEntryBody[] | null> {
  const out: LogEntryBody[] = [];
  for (;;) {
    let page: LogEntryBody[];
    try {
      page = ((await call(c, "GET", `/v2/sandboxes/${encodeURIComponent(id)}/logs?${cursor.query(LOG_PAGE, extra)}`)).data as { logs: LogEntryBody[] }).logs;
    } catch (e) {
      if (out.length === 0 && e instanceof CliError && e.status === 404) return null;
      throw e;
    }
    out.push(...cursor.take(page));
    if (page.length < LOG_PAGE) return out;
  }
}

/** Whether the sandbox is still running or paused. */
async function exists(c: Conn, id: string): Promise<boolean> {
  try {
    await call(c, "GET", `/sandboxes/${encodeURIComponent(id)}`);
    return true;
  } catch (e) {
    if (e instanceof CliError && e.status === 404) return false;
    throw e;
  }
}

export const logs = defineCommand({
  meta: { name: "logs", description: "print a sandbox's log (lifecycle, guest console, envd); --follow for new lines" },
  args: {
    ...watchArgs,
    level: { type: "string", description: "lowest level shown: debug, info, warn, error" },
    search: { type: "string", description: "only lines containing this text" },
  },
  run: ({ args }) =>
    run(async () => {
      const c = conn(args);
      const every = interval(args.interval);
      const extra = { ...(args.level ? { level: args.level } : {}), ...(args.search ? { search: args.search } : {}) };
      const cursor = new LogCursor();
      const print = (e: LogEntryBody) =>
        console.log(args.json ? JSON.stringify(e) : `${clock(e.timestamp)}  ${e.level.padEnd(5)}  ${(e.fields.source ?? "").padEnd(9)}  ${e.message}`);
      const first = await nextLogs(c, args.id, cursor, extra);
      if (first === null) throw new CliError(`sandbox ${args.id} not found`);
      if (!args.follow) {
        if (args.json) return console.log(JSON.stringify(first, null, 2));
        return first.forEach(print);
      }
      first.forEach(print);
      for (;;) {
        await Bun.sleep(every);
        const more = await nextLogs(c, args.id, cursor, extra);
        if (more === null || (more.length === 0 && !(await exists(c, args.id)))) {
          console.error(`sandbox ${args.id} is gone`);
          return;
        }
        more.forEach(print);
      }
    }),
});

export const metrics = defineCommand({
  meta: { name: "metrics", description: "print a sandbox's CPU, memory and disk samples; --follow for new ones" },
  args: watchArgs,
  run: ({ args }) =>
    run(async () => {
      const c = conn(args);
      const every = interval(args.interval);
      const path = `/sandboxes/${encodeURIComponent(args.id)}/metrics`;
      const row = (m: MetricBody) => [clock(m.timestamp), `${m.cpuUsedPct.toFixed(1)}%`.padStart(7), String(m.cpuCount).padStart(4), `${mib(m.memUsed)} / ${mib(m.memTotal)}`.padStart(22), `${mib(m.diskUsed)} / ${mib(m.diskTotal)}`.padStart(24)].join("  ");
      const head = ["TIME".padEnd(23), "CPU %".padStart(7), "vCPU", "MEMORY".padStart(22), "DISK".padStart(24)].join("  ");
      const all = (await call(c, "GET", path)).data as MetricBody[];
      if (!args.follow) {
        if (args.json) return console.log(JSON.stringify(all, null, 2));
        if (all.length === 0) return console.log("no samples yet");
        console.log(head);
        return all.forEach((m) => console.log(row(m)));
      }
      if (!args.json) console.log(head);
      const print = (m: MetricBody) => console.log(args.json ? JSON.stringify(m) : row(m));
      all.forEach(print);
      let last = all[all.length - 1]?.timestampUnix ?? 0;
      for (;;) {
        await Bun.sleep(every);
        let next: MetricBody[];
        try {
          next = (await call(c, "GET", `${path}?start=${last}`)).data as MetricBody[];
        } catch (e) {
          if (e instanceof CliError && e.status === 404) {
            console.error(`sandbox ${args.id} is gone`);
            return;
          }
          throw e;
        }
        for (const m of next) {
          if (m.timestampUnix <= last && all.some((x) => x.timestamp === m.timestamp)) continue;
          all.push(m);
          print(m);
        }
        if (all.length > 1000) all.splice(0, all.length - 1000);
        last = all[all.length - 1]?.timestampUnix ?? last;
      }
    }),
});
