/** `agentenv ublk-daemon`: the node's disk daemon (started by the node; see ./daemon.ts). */
import { defineCommand } from "citty";
import { join } from "node:path";

export default defineCommand({
  meta: { name: "ublk-daemon", description: "disk daemon: serves every sandbox disk of a node (started by the node)" },
  args: {
    dir: { type: "string", description: "daemon directory (socket, database, mounts); default <runtime_path>/disk" },
    settings: { type: "string", description: "settings as JSON (the node passes them); default: from the config" },
  },
  run: async ({ args }) => {
    const { runDaemon } = await import("./daemon.ts");
    try {
      let settings;
      if (args.settings) settings = JSON.parse(args.settings);
      else {
        const { loadConfig } = await import("../../config/index.ts");
        const { daemonSettings, diskConfig } = await import("./config.ts");
        const cfg = loadConfig();
        settings = daemonSettings(diskConfig(cfg), args.dir ?? join(cfg.runtime_path, "disk"));
      }
      if (args.dir) settings.dir = args.dir;
      process.exitCode = await runDaemon(settings, (socket) => process.stdout.write(`ready ${socket}\n`));
    } catch (e) {
      const err = e as Error & { code?: string; details?: unknown };
      process.stderr.write(`ublk-daemon failed: ${err.code ?? ""} ${err.message} ${JSON.stringify(err.details ?? {})}\n`);
      process.exitCode = 1;
    }
    // reader threads may still be parked in epoll_wait: exit explicitly
    process.exit(process.exitCode);
  },
});
