/**
 * `agentenv tools build`: build (or find cached) the read-only tools drive VMs boot through;
 * prints the image path on stdout, progress on stderr. `agentenv tools path`: the current image.
 */
import { defineCommand } from "citty";
import { buildTools, resolveTools } from "../tools/index.ts";
import { loadConfigOrExit } from "../node/load-config.ts";

export default defineCommand({
  meta: { name: "tools", description: "the tools drive (guest init, envd, glibc, busybox)" },
  subCommands: {
    build: defineCommand({
      meta: { description: "build the tools drive (cached by its inputs) and make it the current one" },
      args: { config: { type: "string", description: "config file" } },
      async run({ args }) {
        const cfg = loadConfigOrExit({ path: args.config });
        const t0 = performance.now();
        const r = await buildTools({
          homePath: cfg.home_path,
          busybox: cfg.tools.busybox,
          binaries: cfg.tools.binaries,
          envd: cfg.envd,
          onProgress: (phase, detail) => process.stderr.write(`[${((performance.now() - t0) / 1000).toFixed(1).padStart(6)}s] ${phase}: ${detail}\n`),
        });
        process.stderr.write(`tools ${r.image.key} ${r.built ? "built" : "cached"}\n`);
        console.log(r.image.path);
      },
    }),
    path: defineCommand({
      meta: { description: "print the current tools drive image" },
      args: { config: { type: "string", description: "config file" } },
      run({ args }) {
        console.log(resolveTools(loadConfigOrExit({ path: args.config }).home_path).path);
      },
    }),
  },
});
