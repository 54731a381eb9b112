/**
 * Snapshots from the CLI: `agentenv sandbox snapshot ID [--name N]` (commit a snapshot of a
 * running sandbox; it keeps running), `agentenv sandbox fork ID [--count N] [--timeout S]`
 * (snapshot once, start N children living S seconds, by default as long as a created sandbox), and `agentenv snapshot list|rm` (the node's or cluster's snapshots; `rm`
 * deletes by id or name, as the SDK's `Sandbox.deleteSnapshot` does through
 * `DELETE /templates/{ref}`).
 */
import { defineCommand } from "citty";
import { CREATE_DEFAULT_TIMEOUT_SECS, FORK_DEFAULT_TIMEOUT_SECS } from "../orchestrator/timeouts.ts";
import { call, CliError, common, conn, run, table, type Conn } from "./node-client.ts";

/** A listed snapshot (`GET /snapshots`). */
interface SnapshotRow {
  snapshotID: string;
  names: string[];
  sandboxID?: string | null;
  templateID?: string;
  createdAt?: string;
}

/** Every snapshot of `filter` (`GET /snapshots`, all pages), as listed: oldest first. */
async function listSnapshots(c: Conn, filter: { sandboxID?: string; name?: string }): Promise<SnapshotRow[]> {
  const all: SnapshotRow[] = [];
  let token: string | null = null;
  do {
    const q = new URLSearchParams({ limit: "100", ...(filter.sandboxID ? { sandboxID: filter.sandboxID } : {}), ...(filter.name ? { name: filter.name } : {}), ...(token ? { nextToken: token } : {}) });
    const r = await call(c, "GET", `/snapshots?${q}`);
    all.push(...(r.data as SnapshotRow[]));
    token = r.headers.get("x-next-token");
  } while (token);
  return all;
}

/**
 * The snapshot `ref` names among `rows`: the one with that id, else the newest carrying it as a
 * name (what `Sandbox.create(name)` starts from; a name may stay on older snapshots too).
 */
function pickSnapshot(rows: SnapshotRow[], ref: string): SnapshotRow | undefined {
  const byId = rows.find((r) => r.snapshotID === ref);
  if (byId) return byId;
  let newest: SnapshotRow | undefined;
  for (const r of rows) if (!newest || (r.createdAt ?? "") >= (newest.createdAt ?? "")) newest = r;
  return newest;
}

function count(v: string | undefined, what: string, max: number): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > max) throw new CliError(`--${what} must be 1..${max}, got ${v}`);
  return n;
}

export const snapshotSandbox = defineCommand({
  meta: { name: "snapshot", description: "commit a snapshot of a running sandbox (it keeps running); prints the snapshot id" },
  args: {
    ...common,
    id: { type: "positional", required: true, description: "sandbox id" },
    name: { type: "string", description: "snapshot name (create sandboxes from it by name)" },
    json: { type: "boolean", description: "JSON output" },
  },
  run: ({ args }) =>
    run(async () => {
      const t0 = performance.now();
      const r = (await call(conn(args), "POST", `/sandboxes/${encodeURIComponent(args.id)}/snapshots`, args.name ? { name: args.name } : {})).data as { snapshotID: string; names: string[] };
      if (args.json) return console.log(JSON.stringify(r, null, 2));
      console.log(r.snapshotID);
      console.error(`snapshot of ${args.id}${r.names.length ? ` named ${r.names.join(", ")}` : ""} committed in ${Math.round(performance.now() - t0)} ms`);
    }),
});

export const forkSandbox = defineCommand({
  meta: { name: "fork", description: "fork a running sandbox: one snapshot, N children started from it; prints their ids" },
  args: {
    ...common,
    id: { type: "positional", required: true, description: "sandbox id" },
    count: { type: "string", default: "1", description: "children to start (1..100)" },
    timeout: { type: "string", default: String(CREATE_DEFAULT_TIMEOUT_SECS), description: `lifetime of each child, seconds (default ${CREATE_DEFAULT_TIMEOUT_SECS}, as \`sandbox create\`; the API's own fork default is ${FORK_DEFAULT_TIMEOUT_SECS})` },
    json: { type: "boolean", description: "JSON output" },
  },
  run: ({ args }) =>
    run(async () => {
      const n = count(args.count, "count", 100)!;
      const timeout = Number(args.timeout);
      if (!Number.isInteger(timeout) || timeout < 0) throw new CliError(`--timeout must be a whole number of seconds, got ${args.timeout}`);
      const r = (await call(conn(args), "POST", `/sandboxes/${encodeURIComponent(args.id)}/fork`, { count: n, timeout })).data as {
        sandbox?: { sandboxID: string };
        error?: { message: string; error_code?: string };
      }[];
      if (args.json) console.log(JSON.stringify(r, null, 2));
      const failed = r.filter((x) => x.error);
      for (const x of r) if (x.sandbox && !args.json) console.log(x.sandbox.sandboxID);
      for (const x of failed) console.error(`error: a child failed: ${x.error!.message}`);
      if (failed.length) process.exitCode = 1;
    }),
});

export default defineCommand({
  meta: { name: "snapshot", description: "snapshots on a node (or through a gateway)" },
  subCommands: {
    list: defineCommand({
      meta: { name: "list", description: "list snapshots, oldest first" },
      args: {
        ...common,
        sandbox: { type: "string", description: "only those taken from this sandbox" },
        name: { type: "string", description: "only those with this name (or id)" },
        json: { type: "boolean", description: "JSON output" },
      },
      run: ({ args }) =>
        run(async () => {
          const all = await listSnapshots(conn(args), { sandboxID: args.sandbox, name: args.name });
          if (args.json) return console.log(JSON.stringify(all, null, 2));
          if (all.length === 0) return console.log("no snapshots");
          console.log(
            table(
              ["SNAPSHOT ID", "NAMES", "SANDBOX", "TEMPLATE", "CREATED"],
              all.map((s) => [s.snapshotID, s.names.join(",") || "-", s.sandboxID ?? "-", s.templateID ?? "-", s.createdAt ? s.createdAt.replace("T", " ").slice(0, 19) : "-"]),
            ),
          );
        }),
    }),
    rm: defineCommand({
      meta: { name: "rm", description: "delete a snapshot by id, or the newest carrying a name (sandboxes running from it keep it until they stop)" },
      args: { ...common, ref: { type: "positional", required: true, description: "snapshot id or name" } },
      run: ({ args }) =>
        run(async () => {
          const c = conn(args);
          const target = pickSnapshot(await listSnapshots(c, { name: args.ref }), args.ref);
          if (!target) throw new CliError(`no snapshot ${args.ref}`, 404);
          // by id: the node resolves a name on its own, and the line below must name what went
          await call(c, "DELETE", `/templates/${encodeURIComponent(target.snapshotID)}`);
          console.log(`deleted ${target.snapshotID}`);
        }),
    }),
  },
});
