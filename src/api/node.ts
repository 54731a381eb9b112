/**
 * This node's identity and live figures for `GET /nodes` (E2B `Node` shape).
 */
import { cpus, freemem, hostname, totalmem, arch } from "node:os";
import { statfsSync } from "node:fs";
import { hostCpuPercent } from "../observability/host.ts";
import type { Orchestrator } from "../orchestrator/index.ts";
import pkg from "../../package.json" with { type: "json" };

export interface NodeIdentity {
  id: string;
  clusterId: string;
  /** Directory whose file system is reported as the node's disk. */
  homePath: string;
  startedAt: number;
}

/**
 * The source commit this node runs: `AENV_BUILD_COMMIT` (set when building the binary), else
 * `git rev-parse HEAD` of the checkout it runs from, else "" (a copy without git metadata).
 */
export const BUILD_COMMIT: string = (() => {
  if (process.env.AENV_BUILD_COMMIT) return process.env.AENV_BUILD_COMMIT;
  if (import.meta.dir.startsWith("/$bunfs")) return "";
  const r = Bun.spawnSync(["git", "rev-parse", "HEAD"], { cwd: import.meta.dir, stdout: "pipe", stderr: "ignore" });
  return r.exitCode === 0 ? r.stdout.toString().trim() : "";
})();

/** Node id from config, else the host name reduced to [a-z0-9-]. */
export function nodeId(configured: string): string {
  return configured || hostname().toLowerCase().replace(/[^a-z0-9-]/g, "-") || "node";
}

/** The `Node` body of this node. */
export async function nodeInfo(n: NodeIdentity, orch: Orchestrator) {
  const c = orch.getCounters();
  const cpu = cpus();
  const disks = [];
  try {
    const s = statfsSync(n.homePath);
    disks.push({ mountPoint: n.homePath, device: "", filesystemType: String(s.type), usedBytes: (s.blocks - s.bfree) * s.bsize, totalBytes: s.blocks * s.bsize });
  } catch {
    // home path not created yet: no disk figures
  }
  const live = orch.store.inStates(["creating", "running", "resuming", "pausing"]);
  return {
    id: n.id,
    nodeID: n.id,
    serviceInstanceID: n.id,
    clusterID: n.clusterId,
    status: "ready",
    statusChangedAt: new Date(n.startedAt).toISOString(),
    sandboxCount: c.running + c.paused,
    sandboxStartingCount: c.starting,
    createSuccesses: c.created,
    createFails: c.failed,
    version: pkg.version,
    commit: BUILD_COMMIT,
    machineInfo: { cpuFamily: "", cpuModel: "", cpuModelName: cpu[0]?.model ?? "", cpuArchitecture: arch() },
    metrics: {
      allocatedCPU: live.reduce((a, r) => a + r.cpuCount, 0),
      cpuPercent: await hostCpuPercent(),
      cpuCount: cpu.length,
      allocatedMemoryBytes: live.reduce((a, r) => a + r.memoryMB * 1024 * 1024, 0),
      memoryUsedBytes: totalmem() - freemem(),
      memoryTotalBytes: totalmem(),
      disks,
    },
  };
}
