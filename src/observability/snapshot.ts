/**
 * The node snapshot: identity, machine, host CPU/memory/disk (measured at each call), sandbox
 * counters and the roster. GET /nodes shows it; the scheduler reporter sends it with every
 * heartbeat. The source is a narrow view of the orchestrator, so this layer imports none of it.
 */
import { statfsSync } from "node:fs";
import { cpus, freemem, totalmem } from "node:os";
import pkg from "../../package.json" with { type: "json" };
import type { CpuMeter } from "../ffi/cpu.ts";
import { machineInfo, type MachineInfo } from "./identity.ts";

/** Who the node is. */
export interface NodeIdentityInfo {
  nodeId: string;
  clusterId: string;
  /** This process (changes at every start unless configured). */
  serviceInstanceId: string;
  /** Directory whose file system is reported as the node's disk. */
  homePath: string;
  /** Source commit (buildCommit(), measured once at start). */
  commit: string;
}

/** One sandbox as the snapshot counts it. */
export interface SnapshotSandbox {
  id: string;
  /** Orchestrator state: creating, running, pausing, paused, resuming. */
  state: string;
  cpuCount: number;
  memoryMB: number;
}

/** What the snapshot reads from the orchestrator. */
export interface SnapshotSource {
  counters(): { running: number; paused: number; starting: number; created: number; failed: number };
  /** Every sandbox the node holds (not killed or failed). */
  sandboxes(): SnapshotSandbox[];
}

export interface DiskFigures {
  mountPoint: string;
  device: string;
  filesystemType: string;
  usedBytes: number;
  totalBytes: number;
}

/** A node's figures at one moment (bytes, percent, unix ms). */
export interface NodeSnapshotData {
  identity: NodeIdentityInfo;
  version: string;
  commit: string;
  machine: MachineInfo;
  cpuPercent: number;
  cpuCount: number;
  memoryUsedBytes: number;
  memoryTotalBytes: number;
  disks: DiskFigures[];
  /** Running set (creating, running, pausing, resuming). */
  sandboxCount: number;
  startingCount: number;
  allocatedCpu: number;
  allocatedMemoryBytes: number;
  pausedCount: number;
  pausedAllocatedCpu: number;
  pausedAllocatedMemoryBytes: number;
  createSuccesses: number;
  createFails: number;
  /** Ids of every sandbox held (the scheduler's truth for this node). */
  roster: string[];
  takenAt: number;
}

const MIB = 1024 * 1024;

/** Measure the snapshot (host CPU needs two /proc/stat samples: the first call takes ~100 ms). */
export async function nodeSnapshot(identity: NodeIdentityInfo, source: SnapshotSource, cpu: CpuMeter): Promise<NodeSnapshotData> {
  const takenAt = Date.now();
  const c = source.counters();
  const all = source.sandboxes();
  const active = all.filter((s) => s.state !== "paused");
  const paused = all.filter((s) => s.state === "paused");
  const disks: DiskFigures[] = [];
  try {
    const s = statfsSync(identity.homePath);
    disks.push({ mountPoint: identity.homePath, device: "", filesystemType: String(s.type), usedBytes: (s.blocks - s.bfree) * s.bsize, totalBytes: s.blocks * s.bsize });
  } catch {
    // home path not created yet: no disk figures
  }
  return {
    identity,
    version: pkg.version,
    commit: identity.commit,
    machine: machineInfo(),
    cpuPercent: await cpu.percent(),
    cpuCount: cpus().length,
    memoryUsedBytes: totalmem() - freemem(),
    memoryTotalBytes: totalmem(),
    disks,
    sandboxCount: active.length,
    startingCount: c.starting,
    allocatedCpu: active.reduce((a, s) => a + s.cpuCount, 0),
    allocatedMemoryBytes: active.reduce((a, s) => a + s.memoryMB * MIB, 0),
    pausedCount: paused.length,
    pausedAllocatedCpu: paused.reduce((a, s) => a + s.cpuCount, 0),
    pausedAllocatedMemoryBytes: paused.reduce((a, s) => a + s.memoryMB * MIB, 0),
    createSuccesses: c.created,
    createFails: c.failed,
    roster: all.map((s) => s.id).sort(),
    takenAt,
  };
}
