/**
 * `agentenv sandbox create|list|exec|pause|resume|kill` (and, in their own files, `connect`,
 * `logs`, `metrics`, `snapshot`, `fork`): a client of a node's API (the same E2B routes the SDKs
 * use), reached as node-client.ts says. `exec` runs a command through the sandbox proxy with
 * envd's Connect protocol (JSON codec, server streaming: 5-byte envelope = flags + big-endian
 * length).
 */
import { defineCommand } from "citty";
import { ENVD_PORT } from "../envd/version.ts";
import { call, CliError, common, conn, run, table, type Conn } from "./node-client.ts";
import { CREATE_DEFAULT_TIMEOUT_SECS } from "../orchestrator/timeouts.ts";

function parseKv(list: string | string[] | undefined, what: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const s of list === undefined ? [] : Array.isArray(list) ? list : [list]) {
    const i = s.indexOf("=");
    if (i <= 0) throw new CliError(`${what} must be KEY=VALUE, got ${JSON.stringify(s)}`);
    out[s.slice(0, i)] = s.slice(i + 1);
  }
  return out;
}

export { connectEnvelope, connectFrames } from "../sandbox/connect-frames.ts";
import { connectEnvelope, processStream } from "../sandbox/connect-frames.ts";

/**
 * Run `cmd` with `/bin/bash -l -c` in sandbox `id` through the node's proxy; stdout/stderr are
 * written as they arrive.
 * @returns the exit code.
 */
export async function execInSandbox(c: Conn, id: string, cmd: string, opts: { user?: string; out: (b: Uint8Array) => void; err: (b: Uint8Array) => void }): Promise<number> {
  const info = (await call(c, "GET", `/sandboxes/${id}`)).data as { envdAccessToken?: string };
  const headers: Record<string, string> = {
    "content-type": "application/connect+json",
    "connect-protocol-version": "1",
    "e2b-sandbox-id": id,
    "e2b-sandbox-port": String(ENVD_PORT),
  };
  if (info.envdAccessToken) headers["x-access-token"] = info.envdAccessToken;
  if (opts.user) headers.authorization = `Basic ${btoa(`${opts.user}:`)}`;
  const res = await fetch(`${c.url}/process.Process/Start`, {
    method: "POST",
    headers,
    body: connectEnvelope({ process: { cmd: "/bin/bash", args: ["-l", "-c", cmd] }, stdin: false }),
  });
  if (!res.ok || !res.body) throw new CliError(`exec: ${res.status} ${await res.text()}`);
  let code: number | null = null;
  for await (const m of processStream(res.body)) {
    if (m.end) {
      if (m.error) throw new CliError(`exec: ${m.error.code}: ${m.error.message}`);
      break;
    }
    const ev = m.event;
    if (ev.data?.stdout) opts.out(Buffer.from(ev.data.stdout, "base64"));
    if (ev.data?.stderr) opts.err(Buffer.from(ev.data.stderr, "base64"));
    if (ev.end) code = ev.end.exitCode ?? 0;
  }
  if (code === null) throw new CliError("exec: the process stream ended without an exit status");
  return code;
}

export default defineCommand({
  meta: { name: "sandbox", description: "manage sandboxes on a node" },
  subCommands: {
    create: defineCommand({
      meta: { name: "create", description: "create a sandbox and print its id" },
      args: {
        ...common,
        template: { type: "positional", required: false, default: "base", description: "template id or alias" },
        timeout: { type: "string", description: `lifetime in seconds (default: the node's [orchestrator] default_timeout_secs, ${CREATE_DEFAULT_TIMEOUT_SECS} unless set)` },
        env: { type: "string", description: "KEY=VALUE env var (repeatable)" },
        meta: { type: "string", description: "KEY=VALUE metadata (repeatable)" },
        json: { type: "boolean", description: "print the full response as JSON" },
      },
      run: ({ args }) =>
        run(async () => {
          const c = conn(args);
          const timeout = args.timeout === undefined ? undefined : Number(args.timeout);
          if (timeout !== undefined && (!Number.isInteger(timeout) || timeout < 0)) throw new CliError(`--timeout must be a whole number of seconds, got ${args.timeout}`);
          const t0 = performance.now();
          const r = await call(c, "POST", "/v2/sandboxes", {
            templateID: args.template,
            ...(timeout === undefined ? {} : { timeout }),
            envVars: parseKv(args.env as string | string[] | undefined, "--env"),
            metadata: parseKv(args.meta as string | string[] | undefined, "--meta"),
          });
          const s = r.data as { sandboxID: string; templateID: string };
          if (args.json) return console.log(JSON.stringify(r.data, null, 2));
          console.log(s.sandboxID);
          console.error(`created from ${s.templateID} in ${Math.round(performance.now() - t0)} ms`);
        }),
    }),
    list: defineCommand({
      meta: { name: "list", description: "list running and paused sandboxes" },
      args: { ...common, state: { type: "string", description: "running, paused or running,paused" }, json: { type: "boolean", description: "JSON output" } },
      run: ({ args }) =>
        run(async () => {
          const c = conn(args);
          const all: any[] = [];
          let token: string | null = null;
          do {
            const q = new URLSearchParams({ limit: "100", ...(args.state ? { state: args.state } : {}), ...(token ? { nextToken: token } : {}) });
            const r = await call(c, "GET", `/v2/sandboxes?${q}`);
            all.push(...(r.data as any[]));
            token = r.headers.get("x-next-token");
          } while (token);
          if (args.json) return console.log(JSON.stringify(all, null, 2));
          if (all.length === 0) return console.log("no sandboxes");
          const left = (end: string) => `${Math.max(0, Math.round((Date.parse(end) - Date.now()) / 1000))}s`;
          console.log(
            table(
              ["SANDBOX ID", "TEMPLATE", "STATE", "CPU", "MEM MiB", "STARTED", "EXPIRES IN", "METADATA"],
              all.map((s) => [s.sandboxID, s.alias ?? s.templateID, s.state, String(s.cpuCount), String(s.memoryMB), s.startedAt.replace("T", " ").slice(0, 19), s.state === "running" ? left(s.endAt) : "-", Object.entries(s.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join(",")]),
            ),
          );
        }),
    }),
    exec: defineCommand({
      meta: { name: "exec", description: "run a shell command in a sandbox; exits with its exit code" },
      args: {
        ...common,
        id: { type: "positional", required: true, description: "sandbox id" },
        command: { type: "positional", required: true, description: "shell command (quote it)" },
        user: { type: "string", description: "run as this user (default: the sandbox's, `user`)" },
      },
      run: ({ args }) =>
        run(async () => {
          const code = await execInSandbox(conn(args), args.id, args.command, { user: args.user, out: (b) => process.stdout.write(b), err: (b) => process.stderr.write(b) });
          process.exitCode = code;
        }),
    }),
    pause: defineCommand({
      meta: { name: "pause", description: "pause a sandbox (snapshot kept on the node)" },
      args: { ...common, id: { type: "positional", required: true, description: "sandbox id" } },
      run: ({ args }) =>
        run(async () => {
          await call(conn(args), "POST", `/sandboxes/${args.id}/pause`, {});
          console.log(`paused ${args.id}`);
        }),
    }),
    resume: defineCommand({
      meta: { name: "resume", description: "resume a paused sandbox" },
      args: { ...common, id: { type: "positional", required: true, description: "sandbox id" }, timeout: { type: "string", description: "new lifetime in seconds" } },
      run: ({ args }) =>
        run(async () => {
          const r = await call(conn(args), "POST", `/v2/sandboxes/${args.id}/connect`, args.timeout ? { timeout: Number(args.timeout) } : {});
          console.log(r.status === 201 ? `resumed ${args.id}` : `${args.id} was already running`);
        }),
    }),
    connect: () => import("./sandbox-connect.ts").then((m) => m.default),
    logs: () => import("./sandbox-watch.ts").then((m) => m.logs),
    metrics: () => import("./sandbox-watch.ts").then((m) => m.metrics),
    snapshot: () => import("./snapshot.ts").then((m) => m.snapshotSandbox),
    fork: () => import("./snapshot.ts").then((m) => m.forkSandbox),
    kill: defineCommand({
      meta: { name: "kill", description: "kill a sandbox" },
      args: { ...common, id: { type: "positional", required: true, description: "sandbox id" } },
      run: ({ args }) =>
        run(async () => {
          await call(conn(args), "DELETE", `/sandboxes/${args.id}`);
          console.log(`killed ${args.id}`);
        }),
    }),
  },
});
