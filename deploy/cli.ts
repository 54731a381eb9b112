/** `agentenv deploy render`: print (or write) the Kubernetes manifests of a cluster. */
import { writeFileSync } from "node:fs";
import { defineCommand } from "citty";
import { DEFAULT_RENDER, renderYaml } from "./render.ts";

export default defineCommand({
  meta: { name: "deploy", description: "deployment helpers" },
  subCommands: {
    render: defineCommand({
      meta: { description: "render the Kubernetes manifests (nodes DaemonSet, scheduler, gateway, ConfigMap from config/default.toml, RBAC)" },
      args: {
        out: { type: "string", description: "write to this file instead of stdout" },
        namespace: { type: "string", default: DEFAULT_RENDER.namespace, description: "namespace" },
        image: { type: "string", default: DEFAULT_RENDER.image, description: "image with the agentenv binary (and QEMU)" },
        "gateway-replicas": { type: "string", default: String(DEFAULT_RENDER.gatewayReplicas), description: "gateway replicas" },
      },
      run({ args }) {
        const replicas = Number(args["gateway-replicas"]);
        if (!Number.isInteger(replicas) || replicas < 1) {
          console.error(`agentenv deploy render: --gateway-replicas must be a positive integer, got ${args["gateway-replicas"]}`);
          process.exit(2);
        }
        const yaml = renderYaml({ namespace: args.namespace, image: args.image, gatewayReplicas: replicas });
        if (args.out) writeFileSync(args.out, yaml);
        else process.stdout.write(yaml);
      },
    }),
  },
});
