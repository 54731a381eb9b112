/**
 * Test helpers: a real node (SQLite, orchestrator, API + proxy listener on 127.0.0.1:0) over the
 * VM runtime whose network manager is not started — enough for every route that boots no VM.
 * With `guest` options its sandboxes run as LoopbackRuntime guests (servers on their own
 * 127.x.y.z address) over that VM runtime (templates, network checks, volumes, metrics,
 * snapshots in its repository).
 * Sandboxes are made the way clients make them (`createLoopback` -> the orchestrator's create),
 * never written into the store.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { bootNode, type RunningNode } from "../../src/node/index.ts";
import { netLockPath } from "../../src/node/lock.ts";
import { loadConfig } from "../../src/config/index.ts";
import type { CreateSandboxRequest, SandboxRecord } from "../../src/orchestrator/index.ts";
import { LoopbackRuntime, type LoopbackOptions } from "../helpers/loopback-runtime.ts";
import { idleVmRuntime } from "../helpers/vm-runtime.ts";

export interface TestNode extends RunningNode {
  home: string;
  /** The runtime whose guests the sandboxes are (gates, guest addresses); null: the plain VM runtime. */
  runtime: LoopbackRuntime | null;
  dispose(): Promise<void>;
}

/** A network name prefix of its own (the node's host-wide lock is per prefix). */
export function testPrefix(): string {
  return `t${Math.floor(Math.random() * 0xffffff).toString(16).padStart(6, "0")}-`;
}

/**
 * Boot a node without host networking in a fresh temp data dir, with its own network prefix.
 * @param guest run sandboxes as loopback guests with these options (their HTTP handler, ports);
 *   absent: the VM runtime alone (sandbox starts fail: there is no kernel).
 */
export async function startNodeNoVm(env: Record<string, string> = {}, homeGiven?: string, guest?: Omit<LoopbackOptions, "base">): Promise<TestNode> {
  const home = homeGiven ?? mkdtempSync(join(tmpdir(), "aenv-api-"));
  const prefix = env.AENV__network__name_prefix ?? testPrefix();
  let runtime: LoopbackRuntime | null = null;
  let node: Awaited<ReturnType<typeof bootNode>>;
  try {
    const cfg = loadConfig({
      env: {
        AENV_HOME_PATH: home,
        AENV_RUNTIME_PATH: join(home, "run"),
        AENV_API_ADDR: "127.0.0.1:0",
        AENV_LOG_LEVEL: "error",
        ...env,
        AENV__network__name_prefix: prefix,
      },
    });
    node = await bootNode(cfg, async (c, db) => {
      // the disk daemon starts on first use only (these tests serve no disk)
      const { runtime: base, repo } = idleVmRuntime(c, db, { volumes: true });
      if (!guest) return base;
      // no template of its own until a test creates a sandbox (createLoopback adds "base")
      runtime = new LoopbackRuntime({ templates: [], ...guest, base, snapshots: repo });
      return runtime;
    });
  } catch (e) {
    // a node that refuses to start (a test of bad config) leaves no home this helper made
    if (homeGiven === undefined) rmSync(home, { recursive: true, force: true });
    throw e;
  }
  return {
    ...node,
    runtime,
    home,
    close: async () => {
      await node.close();
      rmSync(netLockPath(prefix), { force: true });
    },
    dispose: async () => {
      await node.close();
      rmSync(home, { recursive: true, force: true });
      rmSync(netLockPath(prefix), { force: true });
    },
  };
}

/**
 * Create a sandbox of template "base" through the orchestrator (as POST /sandboxes does); it
 * runs as a loopback guest. `secure` defaults to true (envd access token set).
 */
export function createLoopback(node: TestNode, req: Partial<CreateSandboxRequest> = {}): Promise<SandboxRecord> {
  if (!node.runtime) throw new Error("createLoopback needs a node started with loopback guests (startNodeNoVm(env, home, {}))");
  if (!node.runtime.templates.includes("base")) node.runtime.templates.push("base");
  return node.orch.create({ template: "base", secure: true, ...req });
}

/** fetch against the node with the API key. */
export function api(node: RunningNode, path: string, init: RequestInit & { key?: string | null } = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  if (init.key !== null) headers.set("x-api-key", init.key ?? node.apiKey);
  if (init.body && !headers.has("content-type")) headers.set("content-type", "application/json");
  return fetch(node.url + path, { ...init, headers });
}
