/**
 * `agentenv template build-base` (Debian base template: mmdebstrap + envd + ext4, cached; local)
 * and `agentenv template list` (asks the node: `GET /templates`, same --url/--key handling as
 * `agentenv sandbox list`).
 */
import { defineCommand } from "citty";
import { loadConfigOrExit } from "./config.ts";
import { buildBase } from "../template/index.ts";
import { call, common, conn, run, table } from "./sandbox.ts";

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
      meta: { name: "build-base", description: "build the Debian base template (idempotent, cached)" },
      args: { config: { type: "string", description: "config file" } },
      async run({ args }) {
        const cfg = loadConfigOrExit({ path: args.config });
        const t0 = performance.now();
        const r = await buildBase({
          homePath: cfg.home_path,
          suite: cfg.template.suite,
          mirror: cfg.template.mirror,
          packages: cfg.template.packages,
          sizeMiB: cfg.template.rootfs_size_mib,
          onProgress(phase, detail) {
            const s = ((performance.now() - t0) / 1000).toFixed(1);
            process.stderr.write(`[${s.padStart(6)}s] ${phase}: ${detail.slice(0, 160)}\n`);
          },
        });
        console.log(`${r.manifest.name} ${r.built ? "built" : "cached"} ${r.manifest.buildKey}`);
      },
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
