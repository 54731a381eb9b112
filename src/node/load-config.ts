/**
 * How every command (`agentenv server`, `scheduler`, `gateway`, `cluster up`, the CLI's own)
 * loads its config at start.
 */
import { type Config, ConfigError, loadConfig } from "../config/index.ts";
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
