/**
 * Helpers of the cluster tests: heartbeat requests, a scheduler started from config on
 * 127.0.0.1:0, and a gRPC client for it.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "nice-grpc";
import { bootNode, type RunningNode } from "../../src/node/index.ts";
import { netLockPath } from "../../src/node/lock.ts";
import { LoopbackRuntime, type LoopbackSharedStore } from "../helpers/loopback-runtime.ts";
import { loadConfig } from "../../src/config/index.ts";
import { NodeStatus, SchedulerDefinition, schedulerChannel, type HeartbeatRequest, type SchedulerClient } from "../../src/cluster/index.ts";
import { schedulerConfig, startScheduler, type RunningScheduler } from "../../services/scheduler/index.ts";
import { waitFor } from "../helpers/wait.ts";
import type { SandboxLifecycleEvent } from "../../src/events/index.ts";

/** A heartbeat from `nodeId` holding `roster`, with `running` sandboxes and `freeMiB` free memory. */
export function beat(nodeId: string, roster: string[], o: { running?: number; freeMiB?: number; reportedAt?: number; instance?: string } = {}): HeartbeatRequest {
  const total = 16 * 1024 ** 3;
  return {
    nodeId,
    clusterId: "c1",
    serviceInstanceId: o.instance ?? `${nodeId}-1`,
    version: "0.1.0",
    commit: "abc",
    machineInfo: { cpuFamily: "6", cpuModel: "85", cpuModelName: "Test CPU", cpuArchitecture: "x64", cpuConfigJson: "" },
    snapshot: {
      status: NodeStatus.NODE_STATUS_UNSPECIFIED,
      allocatedCpu: 0,
      allocatedMemoryBytes: 0,
      cpuPercent: 5,
      cpuCount: 2,
      memoryUsedBytes: total - (o.freeMiB ?? 8192) * 1024 ** 2,
      memoryTotalBytes: total,
      disks: [],
      sandboxCount: o.running ?? roster.length,
      sandboxStartingCount: 0,
      createSuccesses: 0,
      createFails: 0,
      reportedAtUnixMs: o.reportedAt ?? 0,
      pausedSandboxCount: 0,
      pausedAllocatedCpu: 0,
      pausedAllocatedMemoryBytes: 0,
    },
    sandboxIds: roster,
    p2pEndpoint: undefined,
  };
}

/** Start a scheduler on 127.0.0.1:0 with `env` overrides (AENV__scheduler__... keys). */
export async function startTestScheduler(env: Record<string, string>): Promise<RunningScheduler & { client: SchedulerClient }> {
  const s = await startScheduler(schedulerConfig(loadConfig({ env: { AENV_LOG_LEVEL: "error", AENV__scheduler__addr: "127.0.0.1:0", ...env } })));
  const client = createClient(SchedulerDefinition, schedulerChannel(`127.0.0.1:${s.port}`));
  return { ...s, client };
}

/** A redis-server this test started on 127.0.0.1 (no persistence); `stop()` kills it by pid. */
export interface TestRedis {
  url: string;
  port: number;
  stop(): Promise<void>;
}

/**
 * Start Debian's redis-server on a free port. Fails (never skips) when it is not installed.
 * `extraArgs` are appended to its command line (e.g. `--dir`, `--rdbcompression no`).
 * @throws Error with redis-server's output when it does not come up.
 */
export async function startRedis(extraArgs: string[] = []): Promise<TestRedis> {
  const bin = Bun.which("redis-server");
  if (!bin) throw new Error("redis-server missing: install Debian's redis-server (scripts/install.sh --test)");
  const probe = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = probe.port;
  probe.stop(true);
  const p = Bun.spawn([bin, "--bind", "127.0.0.1", "--port", String(port), "--save", "", "--appendonly", "no", "--daemonize", "no", ...extraArgs], { stdout: "pipe", stderr: "pipe" });
  try {
    await waitFor("redis-server to accept connections", async () => {
      if (p.exitCode !== null) throw new Error(`redis-server exited ${p.exitCode}`);
      const c = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {} } }).catch(() => null);
      c?.end();
      return c !== null;
    });
  } catch (e) {
    p.kill("SIGKILL");
    throw new Error(`redis-server did not start (${e instanceof Error ? e.message : String(e)}): ${await new Response(p.stdout).text()}`);
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    stop: async () => {
      p.kill("SIGKILL");
      await p.exited;
    },
  };
}

/** A free TCP port on 127.0.0.1 (probe-and-release). */
export function freePort(): number {
  const s = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const p = s.port;
  s.stop(true);
  return p;
}

/**
 * A real node (API, orchestrator, SQLite, proxy) over LoopbackRuntime, reporting to the
 * scheduler at `schedulerPort` every second, node id `name`; `o.home` starts it on an existing
 * data dir (a restart), `o.sharedStore` lets its paused sandboxes move to other loopback nodes.
 */
export async function startLoopbackNode(
  name: string,
  schedulerPort: number,
  apiKey: string,
  env: Record<string, string> = {},
  templates = ["base"],
  o: { home?: string; sharedStore?: LoopbackSharedStore } = {},
): Promise<RunningNode & { home: string; runtime: LoopbackRuntime; dispose(): Promise<void> }> {
  const home = o.home ?? mkdtempSync(join(tmpdir(), `aenv-${name}-`));
  const prefix = `t${Math.floor(Math.random() * 0xffffff).toString(16).padStart(6, "0")}-`;
  const cfg = loadConfig({
    env: {
      AENV_HOME_PATH: home,
      AENV_RUNTIME_PATH: join(home, "run"),
      AENV_API_ADDR: "127.0.0.1:0",
      AENV_API_KEY: apiKey,
      AENV_LOG_LEVEL: "error",
      AENV_NODE_ID: name,
      AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "true",
      AENV_OBSERVABILITY_SCHEDULER_ENDPOINT: `127.0.0.1:${schedulerPort}`,
      AENV_OBSERVABILITY_REPORT_INTERVAL_SECS: "1",
      AENV__network__name_prefix: prefix,
      ...env,
    },
  });
  const runtime = new LoopbackRuntime({ name, templates, sharedStore: o.sharedStore });
  const node = await bootNode(cfg, async () => runtime);
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    await node.close();
    rmSync(netLockPath(prefix), { force: true });
  };
  return {
    ...node,
    home,
    runtime,
    close,
    dispose: async () => {
      await close();
      rmSync(home, { recursive: true, force: true });
    },
  };
}

/** One delivery a webhook receiver got: its body as sent, its E2B signature header, the event. */
export interface ReceivedEvent {
  raw: string;
  sig: string;
  event: SandboxLifecycleEvent;
}

/** A webhook receiver on 127.0.0.1 answering 204: `got` holds every delivery in arrival order; `stop()` closes it. */
export function webhookReceiver(): { port: number; got: ReceivedEvent[]; stop(): void } {
  const got: ReceivedEvent[] = [];
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch: async (req) => {
      const raw = await req.text();
      got.push({ raw, sig: req.headers.get("e2b-signature") ?? "", event: JSON.parse(raw) as SandboxLifecycleEvent });
      return new Response(null, { status: 204 });
    },
  });
  return { port: server.port!, got, stop: () => void server.stop(true) };
}
