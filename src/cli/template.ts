/**
 * `agentenv template build-base` (Debian base template: mmdebstrap + envd + ext4, cached) and
 * `agentenv template list`.
 */
import { defineCommand } from "citty";
import { get, loadConfig } from "../config/index.ts";
import { buildBase, listTemplates } from "../template/index.ts";

export default defineCommand({
  meta: { name: "template", description: "sandbox templates" },
  subCommands: {
    "build-base": defineCommand({
      meta: { description: "build the Debian base template (idempotent, cached)" },
      args: { config: { type: "string", description: "config file" } },
      async run({ args }) {
        const cfg = loadConfig({ path: args.config });
        const t0 = performance.now();
        const r = await buildBase({
          homePath: get<string>(cfg, "home_path"),
          suite: get<string>(cfg, "template.suite"),
          mirror: get<string>(cfg, "template.mirror"),
          packages: get<string[]>(cfg, "template.packages"),
          sizeMiB: get<number>(cfg, "template.rootfs_size_mib"),
          onProgress(phase, detail) {
            const s = ((performance.now() - t0) / 1000).toFixed(1);
            process.stderr.write(`[${s.padStart(6)}s] ${phase}: ${detail.slice(0, 160)}\n`);
          },
        });
        console.log(`${r.manifest.name} ${r.built ? "built" : "cached"} ${r.manifest.buildKey}`);
      },
    }),
    list: defineCommand({
      meta: { description: "list the templates in the local store" },
      args: { config: { type: "string", description: "config file" }, json: { type: "boolean", description: "JSON output" } },
      run({ args }) {
        const cfg = loadConfig({ path: args.config });
        const all = listTemplates(get<string>(cfg, "home_path"));
        if (args.json) return console.log(JSON.stringify(all, null, 2));
        for (const m of all) console.log(`${m.name}\t${Math.round(m.diskBytes / 1048576)} MiB\t${m.layers.length} layers\t${m.createdAt}`);
      },
    }),
  },
});
