/**
 * `agentenv envd [--port 49983]`: run the in-guest daemon in the foreground until SIGTERM/SIGINT.
 * Settings come from config `[envd]`; flags override them.
 */
import { defineCommand } from "citty";
import { get, loadConfig } from "../config/index.ts";
import { startEnvd } from "../envd/server.ts";

export default defineCommand({
  meta: { name: "envd", description: "run envd, the in-sandbox daemon (E2B envd protocol)" },
  args: {
    port: { type: "string", description: "TCP port (default envd.port, 49983)" },
    host: { type: "string", description: "bind address (default envd.host)" },
    user: { type: "string", description: "default user before /init (default envd.default_user)" },
    "clock-sync": { type: "boolean", description: "set the system clock from /init's timestamp (default envd.clock_sync)" },
    config: { type: "string", description: "config file" },
  },
  async run({ args }) {
    const cfg = loadConfig({ path: args.config });
    const port = args.port !== undefined ? Number(args.port) : get<number>(cfg, "envd.port");
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`invalid --port ${args.port}`);
    const envd = startEnvd({
      port,
      host: args.host ?? get<string>(cfg, "envd.host"),
      defaultUser: args.user ?? get<string>(cfg, "envd.default_user"),
      clockSync: args["clock-sync"] ?? get<boolean>(cfg, "envd.clock_sync"),
      accessToken: process.env.AENV_ENVD_ACCESS_TOKEN || undefined,
      defaultKeepaliveS: get<number>(cfg, "envd.keepalive_interval_s"),
      maxProcesses: get<number>(cfg, "envd.max_processes"),
      exitedRetentionMs: get<number>(cfg, "envd.exited_retention_ms"),
      outputDrainMs: get<number>(cfg, "envd.output_drain_ms"),
      queueHighWater: get<number>(cfg, "envd.stream_queue_events"),
      queueHighWaterBytes: get<number>(cfg, "envd.stream_queue_bytes"),
      maxEventBytes: get<number>(cfg, "envd.output_event_bytes"),
      batchBytes: get<number>(cfg, "envd.output_batch_bytes"),
      gcEveryBytes: get<number>(cfg, "envd.gc_every_output_bytes"),
      maxStreamRequestBytes: get<number>(cfg, "envd.stream_request_max_bytes"),
      maxListEntries: get<number>(cfg, "envd.max_list_entries"),
      maxWatchers: get<number>(cfg, "envd.max_watchers"),
      maxWatcherEvents: get<number>(cfg, "envd.max_watcher_events"),
      maxWatchDirs: get<number>(cfg, "envd.max_watch_dirs"),
      idleTimeoutS: get<number>(cfg, "envd.idle_timeout_s"),
      maxRequestBodyBytes: get<number>(cfg, "envd.max_request_body_bytes"),
      maxComposeSources: get<number>(cfg, "envd.max_compose_sources"),
      enforcePermissions: get<boolean>(cfg, "envd.enforce_permissions"),
      caDir: get<string>(cfg, "envd.ca_dir"),
      caUpdateCommand: get<string>(cfg, "envd.ca_update_command"),
    });
    // Machine-readable readiness line for supervisors and tests.
    process.stdout.write(`envd listening on ${envd.port}\n`);
    await new Promise<void>((resolve) => {
      const stop = () => resolve();
      process.once("SIGTERM", stop);
      process.once("SIGINT", stop);
    });
    await envd.stop();
    process.exit(0);
  },
});
