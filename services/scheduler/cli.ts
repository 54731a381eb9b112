/**
 * `agentenv scheduler`: run the scheduler's gRPC service until SIGINT/SIGTERM.
 */
import { defineCommand } from "citty";
import { loadConfig } from "../../src/config/index.ts";
import { log } from "../../src/observability/log.ts";
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
    try {
      const c = schedulerConfig(loadConfig({ path: args.config, env: { ...process.env, ...(args.addr ? { AENV__scheduler__addr: args.addr } : {}) } }));
      s = await startScheduler(c);
      console.log(`AgentENV scheduler listening on ${s.addr} (store ${c.store}, discovery ${c.discovery}, strategy ${c.strategy})`);
    } catch (e) {
      if (e instanceof AgentEnvError) {
        console.error(`agentenv scheduler: ${e.message}`);
        process.exit(1);
      }
      throw e;
    }
    let stopping = false;
    const stop = (sig: string) => {
      if (stopping) return;
      stopping = true;
      log.info({ signal: sig }, "scheduler shutting down");
      s.close().then(
        () => process.exit(0),
        (err) => {
          log.error({ err }, "scheduler shutdown failed");
          process.exit(1);
        },
      );
    };
    for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(sig, () => stop(sig));
    await new Promise(() => {});
  },
});
