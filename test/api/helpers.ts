/**
 * Test helpers: a real node (SQLite, orchestrator, API + proxy listener on 127.0.0.1:0) over the
 * VM runtime whose network manager is not started — enough for every route that boots no VM.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { bootNode, type RunningNode } from "../../src/node/index.ts";
import { netLockPath } from "../../src/node/lock.ts";
import { loadConfig } from "../../src/config/index.ts";
import { netConfigFromConfig, NetworkManager } from "../../src/net/index.ts";
import { VmRuntime } from "../../src/sandbox/vm-runtime.ts";
import { diskConfig, DiskService } from "../../src/storage/daemon/index.ts";
import { QemuDriver, qemuOptions } from "../../src/vmm/index.ts";
import type { SandboxRecord } from "../../src/orchestrator/index.ts";

export interface TestNode extends RunningNode {
  home: string;
  dispose(): Promise<void>;
}

/** A network name prefix of its own (the node's host-wide lock is per prefix). */
export function testPrefix(): string {
  return `t${Math.floor(Math.random() * 0xffffff).toString(16).padStart(6, "0")}-`;
}

/** Boot a node without host networking in a fresh temp data dir, with its own network prefix. */
export async function startNodeNoVm(env: Record<string, string> = {}, home = mkdtempSync(join(tmpdir(), "aenv-api-"))): Promise<TestNode> {
  const prefix = env.AENV__network__name_prefix ?? testPrefix();
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
  const node = await bootNode(cfg, async (c, db, oc) => {
    // the disk daemon starts on first use only (these tests serve no disk)
    const disks = new DiskService({ dir: join(home, "run", "disk"), config: diskConfig(c) });
    return new VmRuntime({
      homePath: home,
      runtimePath: join(home, "run"),
      kernelPath: () => "/nonexistent",
      driver: new QemuDriver(qemuOptions(c)),
      net: new NetworkManager(netConfigFromConfig(c), db),
      defaultCpuCount: oc.defaultCpuCount,
      defaultMemoryMB: oc.defaultMemoryMB,
      envdPollMs: oc.envdPollMs,
      defaultUser: "user",
      disks,
      volumes: {
        volumesDir: join(home, "volumes"),
        hostDir: join(home, "run", "volumes"),
        disks,
        defaults: { uid: 1000, gid: 1000, fileMode: 0o644, dirMode: 0o755 },
        maxListEntries: 100,
        hostIdleMs: 200,
        guestOpTimeoutMs: 30_000,
      },
    });
  });
  return {
    ...node,
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

/** Register a running sandbox whose ports are served by something on 127.0.0.1 (proxy tests). */
export function adoptLoopback(node: RunningNode, id: string, ports: Record<string, number>, extra: Partial<SandboxRecord> = {}): SandboxRecord {
  const t = Date.now();
  return node.orch.adopt({
    id,
    templateId: "base",
    alias: "base",
    cpuCount: 1,
    memoryMB: 512,
    diskSizeMB: 2048,
    envdVersion: "0.5.7",
    envdAccessToken: "tok",
    trafficAccessToken: null,
    metadata: {},
    envVars: {},
    autoPause: false,
    autoResume: false,
    allowInternetAccess: null,
    network: null,
    runtimeState: null,
    error: null,
    startedAt: t,
    endAt: t + 300_000,
    ...extra,
    endpoint: { host: "127.0.0.1", ports },
  });
}

/** fetch against the node with the API key. */
export function api(node: RunningNode, path: string, init: RequestInit & { key?: string | null } = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  if (init.key !== null) headers.set("x-api-key", init.key ?? node.apiKey);
  if (init.body && !headers.has("content-type")) headers.set("content-type", "application/json");
  return fetch(node.url + path, { ...init, headers });
}
