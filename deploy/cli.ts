/** `agentenv deploy render`: print (or write) the Kubernetes manifests of a cluster. */
import { readFileSync, writeFileSync } from "node:fs";
import { loadConfig } from "../src/config/index.ts";
import { errorMessage } from "../src/util/error.ts";
import { defineCommand } from "citty";
import { isIP } from "node:net";
import { DEFAULT_RENDER, renderYaml } from "./render.ts";

/** Whether `s` is an IPv4 or IPv6 CIDR (address/prefix length in range). */
function isCidr(s: string): boolean {
  const m = /^(.+)\/(\d{1,3})$/.exec(s);
  const v = m ? isIP(m[1]!) : 0;
  return v !== 0 && Number(m![2]) <= (v === 4 ? 32 : 128);
}

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
        config: { type: "string", description: "node configuration file (TOML) for the ConfigMap every node reads, e.g. with [image] registry_mirrors, mirror_only, proxy (default: config/default.toml); checked before rendering" },
        "registry-auth-secret": { type: "string", description: "Secret holding a Docker config.json (key config.json) of registry credentials, mounted into every node as [image] auth_file" },
        "registry-ca-configmap": { type: "string", description: "ConfigMap of PEM CA certificates (*.crt / *.pem keys) for registries, mounted into every node as [image] ca_path" },
        "redis-secret": { type: "string", description: "Secret whose key url is the cluster's Redis (redis://[user:password@]host:port[/db]): the gateway replicas share the secrets store there and the scheduler keeps its bindings there" },
        "node-cidr": { type: "string", default: DEFAULT_RENDER.nodeCidrs.join(","), description: "comma-separated CIDRs of the node hosts: the only addresses besides the gateway Pods the scheduler's NetworkPolicy admits (narrow the default to your nodes' subnet)" },
      },
      run({ args }) {
        const replicas = Number(args["gateway-replicas"]);
        if (!Number.isInteger(replicas) || replicas < 1) {
          console.error(`agentenv deploy render: --gateway-replicas must be a positive integer, got ${args["gateway-replicas"]}`);
          process.exit(2);
        }
        const nodeCidrs = args["node-cidr"].split(",").map((s) => s.trim()).filter(Boolean);
        const bad = nodeCidrs.find((c) => !isCidr(c));
        if (nodeCidrs.length === 0 || bad !== undefined) {
          console.error(`agentenv deploy render: --node-cidr must list CIDRs such as 10.1.0.0/24, got ${JSON.stringify(bad ?? args["node-cidr"])}`);
          process.exit(2);
        }
        let configToml: string | undefined;
        if (args.config) {
          try {
            configToml = readFileSync(args.config, "utf8");
            loadConfig({ path: args.config, env: {} }); // a bad key fails here, not on every node
          } catch (e) {
            console.error(`agentenv deploy render: --config: ${errorMessage(e)}`);
            process.exit(2);
          }
        }
        const name = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
        for (const flag of ["registry-auth-secret", "registry-ca-configmap", "redis-secret"] as const) {
          if (args[flag] !== undefined && !name.test(args[flag])) {
            console.error(`agentenv deploy render: --${flag} must be a Kubernetes object name, got ${JSON.stringify(args[flag])}`);
            process.exit(2);
          }
        }
        const yaml = renderYaml({
          namespace: args.namespace,
          image: args.image,
          gatewayReplicas: replicas,
          nodeCidrs,
          ...(configToml !== undefined ? { configToml } : {}),
          ...(args["registry-auth-secret"] ? { registryAuthSecret: args["registry-auth-secret"] } : {}),
          ...(args["registry-ca-configmap"] ? { registryCaConfigMap: args["registry-ca-configmap"] } : {}),
          ...(args["redis-secret"] ? { redisSecret: args["redis-secret"] } : {}),
        });
        if (replicas > 1 && !args["redis-secret"]) {
          console.error(`agentenv deploy render: warning: ${replicas} gateway replicas without --redis-secret each keep a secrets store of their own, lost when the Pod restarts (docs/security.md)`);
        }
        if (args.out) writeFileSync(args.out, yaml);
        else process.stdout.write(yaml);
      },
    }),
  },
});
