/** `agentenv cluster up`: scheduler + gateway + N nodes on this host (services/cluster/up.ts). */
import { defineCommand } from "citty";
import { join } from "node:path";
import { loadConfigOrExit } from "../../src/node/load-config.ts";
import { runUntilStopped } from "../../src/node/until-stopped.ts";
import { errorMessage } from "../../src/util/error.ts";

export default defineCommand({
  meta: { name: "cluster", description: "a local cluster on one host" },
  subCommands: {
    up: defineCommand({
      meta: { description: "start a scheduler, a gateway and N nodes (own data dirs, runtime paths, network prefixes); prints the E2B SDK line for the gateway" },
      args: {
        home: { type: "string", description: "base directory of the cluster's data dirs (default: $home_path/cluster)" },
        "from-home": { type: "string", description: "data dir whose kernels/, templates/ and tools/ the nodes use (default: $home_path)" },
        runtime: { type: "string", description: "base of the nodes' runtime paths (default: /run/agentenv-cluster)" },
        nodes: { type: "string", default: "2", description: "number of nodes (1..10)" },
        "gateway-addr": { type: "string", description: "gateway listen address (default: [gateway] addr)" },
        "scheduler-port": { type: "string", default: "9090", description: "scheduler port on 127.0.0.1" },
        "node-port": { type: "string", default: "8001", description: "first node API port on 127.0.0.1" },
        "report-interval": { type: "string", default: "1", description: "node heartbeat interval, seconds" },
        "node-restart-delay": { type: "string", description: "pause before a dead node is restarted, ms (default: [cluster.up] node_restart_delay_ms)" },
        build: { type: "boolean", default: true, description: "build a missing guest kernel or base template in --from-home first (--no-build: stop and say what to run)" },
      },
      async run({ args }) {
        const cfg = loadConfigOrExit();
        const up = cfg.cluster.up;
        const { LocalCluster, selfCommand } = await import("./up.ts");
        const { buildPrerequisites, missingMessage, missingPrerequisites } = await import("./prereqs.ts");
        const fromHome = args["from-home"] ?? cfg.home_path;
        const missing = missingPrerequisites(cfg, fromHome);
        if (missing.length && !args.build) {
          console.error(`agentenv cluster up: ${missingMessage(fromHome, missing)}`);
          process.exit(1);
        }
        const num = (v: string, name: string) => {
          const n = Number(v);
          if (!Number.isInteger(n) || n < 0) {
            console.error(`agentenv cluster up: --${name} must be a non-negative integer, got ${v}`);
            process.exit(2);
          }
          return n;
        };
        let cluster: InstanceType<typeof LocalCluster>;
        try {
          await buildPrerequisites(selfCommand(), fromHome, missing, (l) => console.error(l));
          cluster = new LocalCluster({
            home: args.home ?? join(cfg.home_path, "cluster"),
            fromHome,
            runtime: args.runtime ?? "/run/agentenv-cluster",
            nodes: num(args.nodes, "nodes"),
            gatewayAddr: args["gateway-addr"] ?? cfg.gateway.addr,
            schedulerPort: num(args["scheduler-port"], "scheduler-port"),
            nodePortBase: num(args["node-port"], "node-port"),
            apiKey: cfg.api.key,
            reportIntervalSecs: Math.max(1, num(args["report-interval"], "report-interval")),
            nodeRestartDelayMs: args["node-restart-delay"] === undefined ? up.node_restart_delay_ms : num(args["node-restart-delay"], "node-restart-delay"),
            serviceRestartDelayMs: up.service_restart_delay_ms,
            readyTimeoutMs: up.ready_timeout_ms,
            stopTimeoutMs: up.stop_timeout_ms,
            print: (l) => console.log(l),
          });
          await cluster.up();
        } catch (e) {
          console.error(`agentenv cluster up: ${errorMessage(e)}`);
          process.exit(1);
        }
        await runUntilStopped("cluster", () => cluster.down());
      },
    }),
  },
});
