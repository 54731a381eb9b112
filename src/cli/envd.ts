/**
 * `agentenv envd [--port 49983]`: run the in-guest daemon in the foreground until SIGTERM/SIGINT.
 * Settings come from config `[envd]`; flags override them.
 */
import { defineCommand } from "citty";
import { loadConfigOrExit } from "./config.ts";
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
    // The tools drive's init passes envd its own glibc through LD_LIBRARY_PATH; nothing envd
    // starts may inherit it (an image's programs need the image's libraries).
    delete process.env.LD_LIBRARY_PATH;
    const cfg = loadConfigOrExit({ path: args.config });
    const port = args.port !== undefined ? Number(args.port) : cfg.envd.port;
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`invalid --port ${args.port}`);
    const envd = startEnvd({
      port,
      host: args.host ?? cfg.envd.host,
      defaultUser: args.user ?? cfg.envd.default_user,
      clockSync: args["clock-sync"] ?? cfg.envd.clock_sync,
      accessToken: process.env.AENV_ENVD_ACCESS_TOKEN || undefined,
      defaultKeepaliveS: cfg.envd.keepalive_interval_s,
      maxProcesses: cfg.envd.max_processes,
      exitedRetentionMs: cfg.envd.exited_retention_ms,
      outputDrainMs: cfg.envd.output_drain_ms,
      queueHighWater: cfg.envd.stream_queue_events,
      queueHighWaterBytes: cfg.envd.stream_queue_bytes,
      maxEventBytes: cfg.envd.output_event_bytes,
      batchBytes: cfg.envd.output_batch_bytes,
      gcEveryBytes: cfg.envd.gc_every_output_bytes,
      maxStreamRequestBytes: cfg.envd.stream_request_max_bytes,
      maxListEntries: cfg.envd.max_list_entries,
      maxWatchers: cfg.envd.max_watchers,
      maxWatcherEvents: cfg.envd.max_watcher_events,
      maxWatchDirs: cfg.envd.max_watch_dirs,
      idleTimeoutS: cfg.envd.idle_timeout_s,
      maxRequestBodyBytes: cfg.envd.max_request_body_bytes,
      maxComposeSources: cfg.envd.max_compose_sources,
      enforcePermissions: cfg.envd.enforce_permissions,
      caDir: cfg.envd.ca_dir,
      caUpdateCommand: cfg.envd.ca_update_command,
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
