#!/usr/bin/env bun
/**
 * `agentenv` — the single binary's entry point. Each subsystem registers one top-level
 * subcommand here, loaded lazily so `agentenv envd` in a guest does not load the node.
 */
import { defineCommand, renderUsage, runMain, type CommandDef } from "citty";
import pkg from "../../package.json" with { type: "json" };

const main: CommandDef<any> = defineCommand({
  meta: { name: "agentenv", version: pkg.version, description: "AgentENV: AI agent sandboxes in microVMs" },
  subCommands: {
    version: defineCommand({ meta: { description: "print the version" }, run: () => console.log(pkg.version) }),
    config: () => import("./config.ts").then((m) => m.default),
    "ublk-daemon": () => import("../storage/daemon/cli.ts").then((m) => m.default),
    envd: () => import("./envd.ts").then((m) => m.default),
    image: () => import("./image.ts").then((m) => m.default),
    kernel: () => import("./kernel.ts").then((m) => m.default),
    template: () => import("./template.ts").then((m) => m.default),
    tools: () => import("./tools.ts").then((m) => m.default),
    server: () => import("./server.ts").then((m) => m.default),
    sandbox: () => import("./sandbox.ts").then((m) => m.default),
    snapshot: () => import("./snapshot.ts").then((m) => m.default),
    completion: () => import("./completion.ts").then((m) => m.completionCommand(main)),
    events: () => import("./events.ts").then((m) => m.default),
    scheduler: () => import("../../services/scheduler/cli.ts").then((m) => m.default),
    gateway: () => import("../../services/gateway/cli.ts").then((m) => m.default),
    deploy: () => import("../../deploy/cli.ts").then((m) => m.default),
    cluster: () => import("../../services/cluster/cli.ts").then((m) => m.default),
    ublk: () => import("../storage/ublk/cli.ts").then((m) => m.default),
  },
});

type Resolvable<T> = T | Promise<T> | (() => T | Promise<T>);
const resolve = async <T>(v: Resolvable<T>): Promise<T> => (typeof v === "function" ? await (v as () => T | Promise<T>)() : await v);

/**
 * `--help` with the full command path (`agentenv sandbox exec`): citty alone names a leaf by its
 * parent's name + its own (or argv[1] when unnamed). The path follows argv as citty does (the
 * first non-flag argument at each level).
 */
async function showUsage(cmd: CommandDef<any>): Promise<void> {
  const names = ["agentenv"];
  let at: CommandDef<any> = main;
  let rest = process.argv.slice(2);
  for (;;) {
    const subs = at.subCommands ? await resolve(at.subCommands) : undefined;
    const i = rest.findIndex((a) => !a.startsWith("-"));
    if (!subs || i < 0 || !subs[rest[i]!]) break;
    names.push(rest[i]!);
    at = await resolve(subs[rest[i]!]!);
    rest = rest.slice(i + 1);
  }
  const meta = await resolve(cmd.meta ?? {});
  console.log((await renderUsage({ ...cmd, meta: { ...meta, name: names.join(" ") } })) + "\n");
}

// No top-level await: it keeps `bun build --compile --bytecode` possible (the guest binary in the
// base template is built that way; it starts about 10x faster). runMain reports its own errors.
void runMain(main, { showUsage });
