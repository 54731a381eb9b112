/**
 * `agentenv server`: start the node (API + sandbox proxy on `[api] addr`), print the API URL
 * and key, run until SIGINT/SIGTERM/SIGHUP, then shut down (`[orchestrator] shutdown_action`).
 */
import { defineCommand } from "citty";
import { loadConfigOrExit } from "./config.ts";
import { bootNode, NodeError } from "../node/index.ts";
import { log } from "../observability/log.ts";

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
      throw e;
    }
    console.log(`AgentENV node listening on ${node.url}`);
    console.log(`  API key (${node.apiKeySource}): ${node.apiKey}`);
    console.log(`  E2B SDK: E2B_API_URL=${node.url} E2B_SANDBOX_URL=${node.url} E2B_API_KEY=${node.apiKey}`);
    console.log(`  API explorer: ${node.url}/docs`);
    let stopping = false;
    const stop = (sig: string) => {
      if (stopping) return;
      stopping = true;
      log.info({ signal: sig }, "shutting down");
      node.close().then(
        () => process.exit(0),
        (e) => {
          log.error({ err: e }, "shutdown failed");
          process.exit(1);
        },
      );
    };
    process.on("SIGINT", () => stop("SIGINT"));
    process.on("SIGTERM", () => stop("SIGTERM"));
    // VMs and disk servers run in their own sessions: a closed terminal must stop them through us
    process.on("SIGHUP", () => stop("SIGHUP"));
    await new Promise(() => {}); // until a signal
  },
});
