/**
 * `agentenv config`: `defaults` prints config/default.toml as generated from the schema (every key,
 * default, accepted values); `check` loads a config (file + environment) and prints the effective
 * tree as JSON, or the one-line error.
 */
import { defineCommand } from "citty";
import { renderDefaultToml } from "../config/index.ts";
import { loadConfigOrExit } from "../node/load-config.ts";

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
