/**
 * `agentenv ublk-daemon`: the node's disk daemon (started by the node; see ./daemon.ts).
 * `agentenv ublk-daemon --call '<request JSON>'` instead sends one request to the daemon on the
 * directory and prints its answer (exit 1 for an `error` / `invalid_request` answer).
 */
import { defineCommand } from "citty";
import { join } from "node:path";
import { errorCode, errorMessage } from "../../util/error.ts";
import { AgentEnvError } from "../../errors.ts";

export default defineCommand({
  meta: { name: "ublk-daemon", description: "disk daemon: serves every sandbox disk of a node (started by the node)" },
  args: {
    dir: { type: "string", description: "daemon directory (socket, database, mounts); default <runtime_path>/disk" },
    settings: { type: "string", description: "settings as JSON (the node passes them); default: from the config" },
    call: { type: "string", description: "send this request (JSON, e.g. '{\"kind\":\"list\"}') to the running daemon and print the answer" },
  },
  run: async ({ args }) => {
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
      if (args.call !== undefined) {
        const { DaemonClient } = await import("./client.ts");
        const { daemonPaths } = await import("./daemon.ts");
        const c = await DaemonClient.connect(daemonPaths(settings.dir).socket, { timeoutMs: 60_000, maxFrameBytes: settings.maxFrameBytes });
        try {
          const r = await c.request(JSON.parse(args.call));
          process.stdout.write(`${JSON.stringify(r)}\n`);
          process.exitCode = 0;
        } finally {
          c.close();
        }
      } else {
        const { runDaemon } = await import("./daemon.ts");
        process.exitCode = await runDaemon(settings, (socket) => process.stdout.write(`ready ${socket}\n`));
      }
    } catch (e) {
      process.stderr.write(`ublk-daemon failed: ${errorCode(e) ?? ""} ${errorMessage(e)} ${JSON.stringify(e instanceof AgentEnvError ? e.details : {})}\n`);
      process.exitCode = 1;
    }
    // reader threads may still be parked in epoll_wait: exit explicitly
    process.exit(process.exitCode);
  },
});
