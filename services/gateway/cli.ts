/**
 * `agentenv gateway`: run the cluster's E2B API until stopped (src/node/until-stopped.ts); prints the SDK line.
 */
import { defineCommand } from "citty";
import { loadConfig } from "../../src/config/index.ts";
import { AgentEnvError } from "../../src/errors.ts";
import { errorMessage } from "../../src/util/error.ts";
import { runUntilStopped } from "../../src/node/until-stopped.ts";

export default defineCommand({
  meta: { name: "gateway", description: "run the cluster gateway: the E2B API in front of the nodes" },
  args: {
    config: { type: "string", description: "config file (TOML); also AENV_CONFIG_PATH" },
    addr: { type: "string", description: "listen address host:port (overrides [gateway] addr)" },
  },
  async run({ args }) {
    const { gatewayConfig, startGateway } = await import("./index.ts");
    let g: ReturnType<typeof startGateway>;
    try {
      g = startGateway(gatewayConfig(loadConfig({ path: args.config, env: { ...process.env, ...(args.addr ? { AENV__gateway__addr: args.addr } : {}) } })));
    } catch (e) {
      if (e instanceof AgentEnvError) {
        console.error(`agentenv gateway: ${e.message}`);
        process.exit(1);
      }
      throw e;
    }
    // a replica whose key does not open the shared secrets stops here, where an operator sees it;
    // a Redis that does not answer yet is tried again at the first /secrets call
    try {
      await g.gateway.secrets.check();
    } catch (e) {
      if (e instanceof AgentEnvError && e.code === "secrets.key_mismatch") {
        console.error(`agentenv gateway: ${e.message}`);
        await g.close();
        process.exit(1);
      }
      console.error(`agentenv gateway: warning: ${errorMessage(e)}`);
    }
    // the stop handlers first: whoever reads the banner may send SIGTERM at once
    const stopped = runUntilStopped("gateway", () => g.close());
    console.log(`AgentENV gateway listening on ${g.url}`);
    console.log(`  E2B SDK: E2B_API_URL=${g.url} E2B_SANDBOX_URL=${g.url} E2B_API_KEY=${g.apiKey}`);
    if (g.gateway.cfg.console?.enabled) console.log(`  Console: ${g.url}/console/ (every node of the cluster)`);
    await stopped;
  },
});
