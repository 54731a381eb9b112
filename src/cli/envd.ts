/**
 * `agentenv envd [--port N]`: run the in-guest daemon in the foreground until SIGTERM/SIGINT.
 * Settings are the config's `[envd]` section: from `--settings <file>` (that section as JSON; the
 * tools drive carries the node's as /.aenv/etc/envd.json, so the guest needs no config file and
 * envd skips loading the config schema, a noticeable part of its start under TCG), else from the
 * config (file + environment). Flags override them.
 */
import { readFileSync } from "node:fs";
import { defineCommand } from "citty";
import { sectionFrom } from "../config/check.ts";
import ENVD_SECTION from "../config/envd-section.json" with { type: "json" };
import type { Config } from "../config/index.ts";
import { startEnvd, type EnvdOptions } from "../envd/server.ts";
import { ENVD_PORT } from "../envd/version.ts";
import { errorMessage } from "../util/error.ts";

/**
 * envd's options from the config's `[envd]` section. The port is not configurable: the SDKs and
 * the node's proxy reach every guest's envd at ENVD_PORT (49983).
 */
export function envdOptions(s: Config["envd"]): EnvdOptions {
  return {
    port: ENVD_PORT,
    host: s.host,
    defaultUser: s.default_user,
    clockSync: s.clock_sync,
    defaultKeepaliveS: s.keepalive_interval_s,
    maxProcesses: s.max_processes,
    exitedRetentionMs: s.exited_retention_ms,
    killWaitMs: s.kill_wait_ms,
    outputDrainMs: s.output_drain_ms,
    queueHighWater: s.stream_queue_events,
    queueHighWaterBytes: s.stream_queue_bytes,
    detachedOutputBytes: s.detached_output_bytes,
    maxEventBytes: s.output_event_bytes,
    pipeBytes: s.output_pipe_bytes,
    batchBytes: s.output_batch_bytes,
    gcEveryBytes: s.gc_every_output_bytes,
    maxStreamRequestBytes: s.stream_request_max_bytes,
    maxListEntries: s.max_list_entries,
    maxWatchers: s.max_watchers,
    maxWatcherEvents: s.max_watcher_events,
    maxWatchDirs: s.max_watch_dirs,
    idleTimeoutS: s.idle_timeout_s,
    maxRequestBodyBytes: s.max_request_body_bytes,
    maxComposeSources: s.max_compose_sources,
    enforcePermissions: s.enforce_permissions,
    reseedRandom: s.reseed_random,
    caDir: s.ca_dir,
    caBundlePath: s.ca_bundle_path,
    caUpdateCommand: s.ca_update_command,
  };
}

/**
 * The `[envd]` section from a settings file written by the node, checked against the config
 * schema's `[envd]` section (../config/envd-section.json, generated from the schema; keys over its
 * defaults), so a damaged or foreign file stops envd naming the key instead of starting it with a
 * value no code expects.
 * @throws Error naming the file when it is unreadable or not JSON; ConfigError
 *   `config.unknown_key` / `config.bad_value` naming the file and the key
 */
export function readSettings(path: string): Config["envd"] {
  let v: unknown;
  try {
    v = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new Error(`envd settings ${path}: ${errorMessage(e)}`);
  }
  return sectionFrom(ENVD_SECTION, "envd", v, `envd settings ${path}`) as Config["envd"];
}

export default defineCommand({
  meta: { name: "envd", description: "run envd, the in-sandbox daemon (E2B envd protocol)" },
  args: {
    port: { type: "string", description: "TCP port (default 49983, where the SDKs and the node reach envd in a guest; 0 = any free port)" },
    host: { type: "string", description: "bind address (default envd.host)" },
    user: { type: "string", description: "default user before /init (default envd.default_user)" },
    "clock-sync": { type: "boolean", description: "set the system clock from /init's timestamp (default envd.clock_sync)" },
    settings: { type: "string", description: "the [envd] section as JSON (instead of loading the config)" },
    config: { type: "string", description: "config file" },
  },
  async run({ args }) {
    // The tools drive's init passes envd its own glibc through LD_LIBRARY_PATH; nothing envd
    // starts may inherit it (an image's programs need the image's libraries).
    delete process.env.LD_LIBRARY_PATH;
    // nor the JavaScriptCore options it may set for envd's own runtime ([envd] jsc_options)
    for (const k of Object.keys(process.env)) if (k.startsWith("BUN_JSC_")) delete process.env[k];
    // the config module (and its schema library) loads only when there is no settings file
    const section = args.settings ? readSettings(args.settings) : (await import("../node/load-config.ts")).loadConfigOrExit({ path: args.config }).envd;
    // nor the rest of its runtime's environment ([envd] runtime_env)
    for (const w of String(section.runtime_env ?? "").split(" ")) if (w.includes("=")) delete process.env[w.slice(0, w.indexOf("="))];
    const opts = envdOptions(section);
    const port = args.port !== undefined ? Number(args.port) : opts.port;
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`invalid --port ${args.port}`);
    const envd = startEnvd({
      ...opts,
      port,
      host: args.host ?? opts.host,
      defaultUser: args.user ?? opts.defaultUser,
      clockSync: args["clock-sync"] ?? opts.clockSync,
      accessToken: process.env.AENV_ENVD_ACCESS_TOKEN || undefined,
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
