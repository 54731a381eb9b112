/**
 * `agentenv config`: `defaults` prints config/default.toml as generated from the schema (every key,
 * default, accepted values); `check` loads a config (file + environment) and prints the effective
 * tree as JSON, or the one-line error. `loadConfigOrExit` is how every command loads its config.
 */
import { defineCommand } from "citty";
import { type Config, ConfigError, loadConfig, renderDefaultToml } from "../config/index.ts";
import { log } from "../observability/log.ts";

/**
 * Load the config for a command and apply `[log] level` to the process logger; a ConfigError
 * ends the process with exit code 1 and its one-line message on stderr (naming the source, key,
 * value and what was expected).
 */
export function loadConfigOrExit(opts: Parameters<typeof loadConfig>[0] = {}): Config {
  try {
    const cfg = loadConfig(opts);
    log.level = cfg.log.level;
    return cfg;
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    console.error(`agentenv: ${e.message}`);
    process.exit(1);
  }
}

export default defineCommand({
  meta: { name: "config", description: "print the defaults or check a configuration" },
  subCommands: {
    defaults: defineCommand({
      meta: { description: "print config/default.toml (every key with its default and accepted values)" },
      run: () => void process.stdout.write(renderDefaultToml()),
    }),
    check: defineCommand({
      meta: { description: "load a config (file + AENV_* environment) and print the effective values as JSON" },
      args: { config: { type: "string", description: "config file (TOML); also AENV_CONFIG_PATH" } },
      run: ({ args }) => console.log(JSON.stringify(loadConfigOrExit({ path: args.config }), null, 2)),
    }),
  },
});
