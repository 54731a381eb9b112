/**
 * `agentenv template build-base` (Debian base template: mmdebstrap + envd + ext4, cached; local),
 * and against the node (same --url/--key handling as `agentenv sandbox`): `template list`,
 * `template build --dockerfile FILE --name NAME` (a Dockerfile's FROM/RUN/COPY/ENV/ARG/WORKDIR/
 * USER/CMD as a template build; FROM a template of the node builds on it, else on the image:
 * the node's rule, src/template/spec.ts dockerfileBase; COPY sources uploaded from the context
 * directory),
 * `template pull IMAGE --name NAME` (a registry image as a template, optional start/ready
 * command), `template rm NAME`. Builds stream their log lines to stderr with the elapsed time.
 */
import { defineCommand } from "citty";
import { loadConfigOrExit } from "../node/load-config.ts";
import { buildBase } from "../template/index.ts";
import { dirname, resolve } from "node:path";
import { readFileSync } from "node:fs";
import { parseDockerfile } from "../template/dockerfile.ts";
import { call, CliError, common, conn, run, table } from "./node-client.ts";
import { buildOnNode, filesHash } from "./template-build.ts";
import { BuildProgress } from "./build-progress.ts";
import { commitTemplateSnapshot, warmTemplateEnvd } from "../sandbox/template-snapshot.ts";
import { waitEnvdHealthy } from "../sandbox/envd-health.ts";
import { errorMessage } from "../util/error.ts";

/** Run a build with its progress display on stderr (a status line when stderr is a terminal). */
async function withProgress<T>(fn: (log: (line: string) => void) => Promise<T>): Promise<T> {
  const p = new BuildProgress(process.stderr, process.stderr.isTTY === true);
  try {
    return await fn((line) => p.log(line));
  } finally {
    p.done();
  }
}

const sizeArgs = {
  cpu: { type: "string", description: "build VM and sandbox vCPUs" },
  memory: { type: "string", description: "build VM and sandbox memory, MiB" },
  "no-cache": { type: "boolean", description: "run every step again (skip the step cache)" },
} as const;

function num(v: string | undefined, what: string): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new CliError(`--${what} must be a positive integer, got ${v}`);
  return n;
}

/** `GET /templates` item fields the table shows. */
interface TemplateRow {
  templateID: string;
  aliases: string[];
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  buildStatus: string;
  spawnCount: number;
  lastSpawnedAt: string | null;
  createdAt: string;
}

const when = (iso: string | null) => (iso ? iso.replace("T", " ").slice(0, 19) : "-");

export default defineCommand({
  meta: { name: "template", description: "sandbox templates" },
  subCommands: {
    "build-base": defineCommand({
      meta: { name: "build-base", description: "build the Debian base template and commit its snapshot (idempotent, cached)" },
      args: {
        config: { type: "string", description: "config file" },
        snapshot: { type: "boolean", description: "boot it once and commit the snapshot sandboxes are restored from (default [template] snapshot)" },
      },
      async run({ args }) {
        const cfg = loadConfigOrExit({ path: args.config });
        const t0 = performance.now();
        const onProgress = (phase: string, detail: string) => {
          const s = ((performance.now() - t0) / 1000).toFixed(1);
          process.stderr.write(`[${s.padStart(6)}s] ${phase}: ${detail.slice(0, 160)}\n`);
        };
        const r = await buildBase({
          homePath: cfg.home_path,
          suite: cfg.template.suite,
          mirror: cfg.template.mirror,
          packages: cfg.template.packages,
          sizeMiB: cfg.template.rootfs_size_mib,
          toolTimeoutMs: cfg.template.tool_timeout_ms,
          tools: { ...cfg.tools, envd: cfg.envd },
          onProgress,
        });
        let snap = "";
        if (args.snapshot ?? cfg.template.snapshot) {
          const sr = await commitTemplateSnapshot(cfg, r.manifest.name, onProgress);
          snap = ` snapshot ${sr.snapshotId}${sr.built ? "" : " (cached)"}`;
        }
        console.log(`${r.manifest.name} ${r.built ? "built" : "cached"} ${r.manifest.buildKey}${snap}`);
      },
    }),
    "probe-envd": defineCommand({
      meta: { name: "probe-envd", description: "(run by build-base inside the template VM's netns) wait for envd and run a first command" },
      args: {
        url: { type: "string", required: true, description: "envd base URL" },
        "timeout-ms": { type: "string", description: "give up after this long (default 180000)" },
      },
      async run({ args }) {
        const t0 = performance.now();
        const signal = AbortSignal.timeout(Number(args["timeout-ms"] ?? 180_000));
        await waitEnvdHealthy(args.url, 50, signal);
        const healthMs = Math.round(performance.now() - t0);
        const r = await warmTemplateEnvd(args.url, signal);
        if (r.exitCode !== 0 || r.output.trim() !== "user") throw new CliError(`first command in the template VM gave exit ${r.exitCode}, output ${JSON.stringify(r.output)}`);
        console.log(JSON.stringify({ healthMs, readyMs: Math.round(performance.now() - t0) }));
      },
    }),
    build: defineCommand({
      meta: { name: "build", description: "build a template from a Dockerfile on the node" },
      args: {
        ...common,
        ...sizeArgs,
        dockerfile: { type: "string", description: "Dockerfile path (FROM a template of the node builds on it; any other FROM is an image: docker.io/library/NAME names the image when a template has that name)", required: true },
        name: { type: "string", description: "template name[:tag]", required: true },
        context: { type: "string", description: "directory COPY sources are relative to (default: the Dockerfile's)" },
      },
      run: ({ args }) =>
        run(async () => {
          const file = resolve(args.dockerfile);
          const contextDir = resolve(args.context ?? dirname(file));
          let text: string;
          try {
            text = readFileSync(file, "utf8");
          } catch (e) {
            throw new CliError(`cannot read ${file}: ${errorMessage(e)}`);
          }
          let df;
          try {
            df = parseDockerfile(text, (src, dest) => filesHash(contextDir, src, dest));
          } catch (e) {
            if (e instanceof CliError) throw e;
            throw new CliError(errorMessage(e));
          }
          const c = conn(args);
          const build = { name: args.name, from: df.from, steps: df.steps, startCmd: df.startCmd, readyCmd: df.readyCmd, contextDir, cpuCount: num(args.cpu, "cpu"), memoryMB: num(args.memory, "memory"), force: args["no-cache"] === true };
          const r = await withProgress((log) => buildOnNode(c, build, log));
          console.log(`${args.name} ready: template ${r.templateID} build ${r.buildID}`);
        }),
    }),
    pull: defineCommand({
      meta: { name: "pull", description: "make a template of a registry image on the node" },
      args: {
        ...common,
        ...sizeArgs,
        image: { type: "positional", description: "image reference, e.g. 127.0.0.1:5000/app:v1", required: true },
        name: { type: "string", description: "template name[:tag]", required: true },
        "start-cmd": { type: "string", description: "command started in every sandbox (before it is handed out)" },
        "ready-cmd": { type: "string", description: "command polled until it exits 0 after the start command" },
        port: { type: "string", description: "ready when this port listens (instead of --ready-cmd)" },
        username: { type: "string", description: "registry user" },
        password: { type: "string", description: "registry password (AENV_REGISTRY_PASSWORD)" },
      },
      run: ({ args }) =>
        run(async () => {
          const port = num(args.port, "port");
          const readyCmd = port ? `[ -n "$(ss -Htuln sport = :${port})" ]` : (args["ready-cmd"] ?? "");
          const password = args.password ?? process.env.AENV_REGISTRY_PASSWORD;
          if (args.username && password === undefined) throw new CliError("--username needs --password or AENV_REGISTRY_PASSWORD");
          const c = conn(args);
          const r = await withProgress((log) =>
            buildOnNode(c, {
              name: args.name,
              fromImage: args.image,
              ...(args.username ? { registry: { username: args.username, password: password! } } : {}),
              steps: [],
              startCmd: args["start-cmd"] ?? "",
              readyCmd,
              contextDir: process.cwd(),
              cpuCount: num(args.cpu, "cpu"),
              memoryMB: num(args.memory, "memory"),
              force: args["no-cache"] === true,
            }, log),
          );
          console.log(`${args.name} ready: template ${r.templateID} build ${r.buildID}`);
        }),
    }),
    rm: defineCommand({
      meta: { name: "rm", description: "delete a template (its builds and tags) from the node" },
      args: { ...common, name: { type: "positional", description: "template name or id", required: true } },
      run: ({ args }) =>
        run(async () => {
          await call(conn(args), "DELETE", `/templates/${encodeURIComponent(args.name)}`);
          console.log(`${args.name} deleted`);
        }),
    }),
    list: defineCommand({
      meta: { name: "list", description: "list the node's templates" },
      args: { ...common, json: { type: "boolean", description: "JSON output" } },
      run: ({ args }) =>
        run(async () => {
          const all = (await call(conn(args), "GET", "/templates")).data as TemplateRow[];
          if (args.json) return console.log(JSON.stringify(all, null, 2));
          if (all.length === 0) return console.log("no templates");
          console.log(
            table(
              ["TEMPLATE ID", "ALIASES", "STATUS", "CPU", "MEM MiB", "DISK MiB", "SPAWNS", "LAST SPAWNED", "CREATED"],
              all.map((t) => [t.templateID, t.aliases.join(",") || "-", t.buildStatus, String(t.cpuCount), String(t.memoryMB), String(t.diskSizeMB), String(t.spawnCount), when(t.lastSpawnedAt), when(t.createdAt)]),
            ),
          );
        }),
    }),
  },
});
