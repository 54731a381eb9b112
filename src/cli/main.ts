#!/usr/bin/env bun
/**
 * `agentenv` — the single binary's entry point. Each subsystem registers one top-level
 * subcommand here, loaded lazily so `agentenv envd` in a guest does not load the node.
 */
import { defineCommand, runMain } from "citty";
import pkg from "../../package.json" with { type: "json" };

const main = defineCommand({
  meta: { name: "agentenv", version: pkg.version, description: "AgentENV: AI agent sandboxes in microVMs" },
  subCommands: {
    version: defineCommand({ meta: { description: "print the version" }, run: () => console.log(pkg.version) }),
    disk: () => import("../storage/daemon/cli.ts").then((m) => m.default),
    envd: () => import("./envd.ts").then((m) => m.default),
    image: () => import("./image.ts").then((m) => m.default),
    kernel: () => import("./kernel.ts").then((m) => m.default),
    template: () => import("./template.ts").then((m) => m.default),
    server: () => import("./server.ts").then((m) => m.default),
    sandbox: () => import("./sandbox.ts").then((m) => m.default),
  },
});

// No top-level await: it keeps `bun build --compile --bytecode` possible (the guest binary in the
// base template is built that way; it starts about 10x faster). runMain reports its own errors.
void runMain(main);
