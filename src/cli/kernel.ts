/**
 * `agentenv kernel build`: build (or find cached) the guest kernel from Debian's kernel source
 * with the project config fragment; prints the vmlinux path on stdout, progress on stderr.
 */
import { defineCommand } from "citty";
import { loadConfigOrExit } from "../node/load-config.ts";
import { buildKernel } from "../vmm/kernel/build.ts";

export default defineCommand({
  meta: { name: "kernel", description: "guest kernel" },
  subCommands: {
    build: defineCommand({
      meta: { description: "build the guest kernel (cached by source version and config fragment)" },
      args: { config: { type: "string", description: "config file" } },
      async run({ args }) {
        const cfg = loadConfigOrExit({ path: args.config });
        let last = -1;
        const art = await buildKernel({
          homePath: cfg.home_path,
          sourceTarball: cfg.kernel.source_tarball,
          sourcePackage: cfg.kernel.source_package,
          jobs: cfg.kernel.jobs,
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
