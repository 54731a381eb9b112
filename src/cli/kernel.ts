/**
 * `agentenv kernel build`: build (or find cached) the guest kernel from Debian's kernel source
 * with the project config fragment; prints the vmlinux path on stdout, progress on stderr.
 */
import { defineCommand } from "citty";
import { get, loadConfig } from "../config/index.ts";
import { buildKernel } from "../vmm/kernel/build.ts";

export default defineCommand({
  meta: { name: "kernel", description: "guest kernel" },
  subCommands: {
    build: defineCommand({
      meta: { description: "build the guest kernel (cached by source version and config fragment)" },
      args: { config: { type: "string", description: "config file" } },
      async run({ args }) {
        const cfg = loadConfig({ path: args.config });
        let last = -1;
        const art = await buildKernel({
          homePath: get<string>(cfg, "home_path"),
          sourceTarball: get<string>(cfg, "kernel.source_tarball"),
          sourcePackage: get<string>(cfg, "kernel.source_package"),
          jobs: get<number>(cfg, "kernel.jobs"),
          onProgress(done, total) {
            const pct = Math.floor((done * 100) / total);
            if (pct !== last) {
              last = pct;
              process.stderr.write(`\rkernel build: ${pct}% (${done} steps)`);
            }
          },
        });
        if (art.built) process.stderr.write("\n");
        process.stderr.write(`kernel ${art.key} (${art.sourceVersion}) ${art.built ? "built" : "cached"}\n`);
        console.log(art.path);
      },
    }),
  },
});
