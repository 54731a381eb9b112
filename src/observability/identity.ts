/**
 * Who this node is: id, source commit, and the static machine description (/proc/cpuinfo), as
 * shown by GET /nodes and sent in scheduler heartbeats.
 */
import { readFileSync } from "node:fs";
import { arch, cpus, hostname } from "node:os";

/**
 * The source commit this node runs: `AENV_BUILD_COMMIT` (set when building the binary), else
 * `git rev-parse HEAD` of the checkout it runs from, else "" (a copy without git metadata).
 * Spawns git: call it once at start-up (bootNode) and pass the result on.
 */
export function buildCommit(env: Record<string, string | undefined> = process.env): string {
  if (env.AENV_BUILD_COMMIT) return env.AENV_BUILD_COMMIT;
  if (import.meta.dir.startsWith("/$bunfs")) return "";
  const r = Bun.spawnSync(["git", "rev-parse", "HEAD"], { cwd: import.meta.dir, stdout: "pipe", stderr: "ignore" });
  return r.exitCode === 0 ? r.stdout.toString().trim() : "";
}

/** Node id from config, else the host name reduced to [a-z0-9-]. */
export function nodeId(configured: string): string {
  return configured || hostname().toLowerCase().replace(/[^a-z0-9-]/g, "-") || "node";
}

/** Static CPU description (E2B `machineInfo`, proto MachineInfo). */
export interface MachineInfo {
  cpuFamily: string;
  cpuModel: string;
  cpuModelName: string;
  cpuArchitecture: string;
}

/**
 * Parse the first processor block of /proc/cpuinfo (`cpu family`, `model`, `model name`);
 * fields it lacks (other architectures) stay "".
 */
export function parseCpuinfo(text: string, architecture = arch()): MachineInfo {
  const field = (name: string) => new RegExp(`^${name}\\s*:\\s*(.*)$`, "m").exec(text.split("\n\n", 1)[0]!)?.[1]?.trim() ?? "";
  return { cpuFamily: field("cpu family"), cpuModel: field("model"), cpuModelName: field("model name") || (cpus()[0]?.model ?? ""), cpuArchitecture: architecture };
}

/** This host's MachineInfo, read from /proc/cpuinfo at each call (a few KiB; no cached state). */
export function machineInfo(): MachineInfo {
  let text = "";
  try {
    text = readFileSync("/proc/cpuinfo", "utf8");
  } catch {
    // no /proc: names from os.cpus() only
  }
  return parseCpuinfo(text);
}
