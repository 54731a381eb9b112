/**
 * `agentenv scheduler`: run the scheduler's gRPC service until stopped (src/node/until-stopped.ts).
 */
import { defineCommand } from "citty";
import { loadConfig } from "../../src/config/index.ts";
import { runUntilStopped } from "../../src/node/until-stopped.ts";
import { AgentEnvError } from "../../src/errors.ts";

export default defineCommand({
  meta: { name: "scheduler", description: "run the cluster scheduler (gRPC): placement and sandbox -> node bindings" },
  args: {
    config: { type: "string", description: "config file (TOML); also AENV_CONFIG_PATH" },
    addr: { type: "string", description: "gRPC listen address host:port (overrides [scheduler] addr)" },
  },
  async run({ args }) {
    const { schedulerConfig, startScheduler } = await import("./index.ts");
    let s: Awaited<ReturnType<typeof startScheduler>>;
    let c: ReturnType<typeof schedulerConfig>;
    try {
      c = schedulerConfig(loadConfig({ path: args.config, env: { ...process.env, ...(args.addr ? { AENV__scheduler__addr: args.addr } : {}) } }));
      s = await startScheduler(c);
    } catch (e) {
      if (e instanceof AgentEnvError) {
        console.error(`agentenv scheduler: ${e.message}`);
        process.exit(1);
      }
      throw e;
    }
    // the stop handlers first: whoever reads the banner may send SIGTERM at once
    const stopped = runUntilStopped("scheduler", () => s.close());
    console.log(`AgentENV scheduler listening on ${s.addr} (store ${c.store}, discovery ${c.discovery}, strategy ${c.strategy})`);
    await stopped;
  },
});
