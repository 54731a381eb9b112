/**
 * `agentenv server`: start the node (API + sandbox proxy on `[api] addr`), print the API URL
 * and key, run until stopped (src/node/until-stopped.ts), then shut down
 * (`[orchestrator] shutdown_action`).
 */
import { defineCommand } from "citty";
import { loadConfigOrExit } from "../node/load-config.ts";
import { ConfigError } from "../config/index.ts";
import { bootNode, NodeError } from "../node/index.ts";
import { runUntilStopped } from "../node/until-stopped.ts";

export default defineCommand({
  meta: { name: "server", description: "run the node: E2B-compatible API and sandbox proxy" },
  args: {
    config: { type: "string", description: "config file (TOML); also AENV_CONFIG_PATH" },
    addr: { type: "string", description: "listen address host:port (overrides [api] addr / AENV_API_ADDR)" },
  },
  async run({ args }) {
    const env = { ...process.env, ...(args.addr ? { AENV_API_ADDR: args.addr } : {}) };
    const cfg = loadConfigOrExit({ path: args.config, env });
    let node: Awaited<ReturnType<typeof bootNode>>;
    try {
      node = await bootNode(cfg);
    } catch (e) {
      // another node owns this runtime path / prefix, or the address is taken: one clear line
      if (e instanceof NodeError) {
        console.error(`agentenv server: ${e.message}`);
        process.exit(1);
      }
      // settings that load but cannot be used ([image] ca_path missing, ...): one line, as load errors
      if (e instanceof ConfigError) {
        console.error(`agentenv: ${e.message}`);
        process.exit(1);
      }
      throw e;
    }
    // the stop handlers first: whoever reads the banner may send SIGTERM at once
    const stopped = runUntilStopped("node", () => node.close());
    console.log(`AgentENV node listening on ${node.url}`);
    console.log(`  API key (${node.apiKeySource}): ${node.apiKey}`);
    console.log(`  E2B SDK: E2B_API_URL=${node.url} E2B_SANDBOX_URL=${node.url} E2B_API_KEY=${node.apiKey}`);
    console.log(`  API explorer: ${node.url}/docs`);
    if (cfg.console.enabled) console.log(`  Console: ${node.url}/console/ (log in with the API key)`);
    await stopped;
  },
});
