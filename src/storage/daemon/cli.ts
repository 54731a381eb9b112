/** `agentenv disk ...`: internal subcommands of the disk service. */
import { defineCommand } from "citty";

export default defineCommand({
  meta: { name: "disk", description: "disk service (internal)" },
  subCommands: {
    serve: defineCommand({
      meta: { description: "serve one disk image as a file on a FUSE mount (spawned by the node)" },
      args: {
        spec: { type: "string", required: true, description: "JSON disk spec file" },
        "fuse-fd": { type: "string", required: true, description: "inherited /dev/fuse fd of the mounted connection" },
        resume: { type: "boolean", default: false, description: "replacement server: ask the kernel to re-send pending requests" },
      },
      run: async ({ args }) => {
        const { serveDisk } = await import("./serve.ts");
        try {
          process.exitCode = await serveDisk(args.spec, Number(args["fuse-fd"]), args.resume);
        } catch (e) {
          const err = e as Error & { code?: string; details?: unknown };
          process.stderr.write(`disk serve failed: ${err.code ?? ""} ${err.message} ${JSON.stringify(err.details ?? {})}\n`);
          process.exitCode = 1;
        }
        // reader threads may still be parked in read(2): exit explicitly
        process.exit(process.exitCode);
      },
    }),
  },
});
