/**
 * This node's identity and live figures for `GET /nodes` (E2B `Node` shape).
 */
import { cpus, freemem, totalmem } from "node:os";
import { statfsSync } from "node:fs";
import type { CpuMeter } from "../ffi/cpu.ts";
import { machineInfo } from "../observability/identity.ts";
import type { SandboxService } from "../orchestrator/index.ts";
import pkg from "../../package.json" with { type: "json" };

export interface NodeIdentity {
  id: string;
  clusterId: string;
  /** Directory whose file system is reported as the node's disk. */
  homePath: string;
  startedAt: number;
  /** This node process's id (heartbeats); the node id when absent. */
  serviceInstanceId?: string;
  /** Source commit (buildCommit(), measured once at start). */
  commit: string;
}

export { buildCommit, nodeId } from "../observability/identity.ts";

/** The `Node` body of this node; `meter` is the caller's CPU meter (its window runs from its previous call). */
export async function nodeInfo(n: NodeIdentity, orch: SandboxService, meter: CpuMeter) {
  const c = orch.getCounters();
  const cpu = cpus();
  const disks = [];
  try {
    const s = statfsSync(n.homePath);
    disks.push({ mountPoint: n.homePath, device: "", filesystemType: String(s.type), usedBytes: (s.blocks - s.bfree) * s.bsize, totalBytes: s.blocks * s.bsize });
  } catch {
    // home path not created yet: no disk figures
  }
  const live = orch.inStates(["creating", "running", "resuming", "pausing"]);
  return {
    id: n.id,
    nodeID: n.id,
    serviceInstanceID: n.serviceInstanceId ?? n.id,
    clusterID: n.clusterId,
    status: "ready",
    statusChangedAt: new Date(n.startedAt).toISOString(),
    sandboxCount: c.running + c.paused,
    sandboxStartingCount: c.starting,
    createSuccesses: c.created,
    createFails: c.failed,
    version: pkg.version,
    commit: n.commit,
    machineInfo: machineInfo(),
    metrics: {
      allocatedCPU: live.reduce((a, r) => a + r.cpuCount, 0),
      cpuPercent: await meter.percent(),
      cpuCount: cpu.length,
      allocatedMemoryBytes: live.reduce((a, r) => a + r.memoryMB * 1024 * 1024, 0),
      memoryUsedBytes: totalmem() - freemem(),
      memoryTotalBytes: totalmem(),
      disks,
    },
  };
}
