/**
 * VMM process records and reaping. Each running VMM has `<runtimeDir>/vmm/<id>.json` holding its
 * pid, its start time (field 22 of /proc/<pid>/stat, clock ticks since host boot: tells a live
 * VMM from a recycled pid) and the files it owns. A node that crashed leaves these behind;
 * `reapLeftovers` kills the matching processes and deletes their files at start-up.
 */
import { processStartTime } from "../ffi/proc.ts";
import { waitExit } from "../ffi/pidfd.ts";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { logger } from "../observability/log.ts";

const log = logger("vmm.supervise");

/** What a VMM record file holds. */
export interface VmmRecord {
  id: string;
  driver: "qemu" | "firecracker";
  pid: number;
  /** /proc/<pid>/stat field 22 (starttime, clock ticks). */
  startTime: number;
  /** Files and sockets to delete when the VMM is gone (RAM file, control socket, ...). */
  ownedFiles: string[];
}

export { processStartTime };

/** Directory of the VMM records under a runtime directory. */
export function recordDir(runtimeDir: string): string {
  return join(runtimeDir, "vmm");
}

/** Write (atomically) the record of a freshly spawned VMM. */
export function writeRecord(runtimeDir: string, rec: VmmRecord): void {
  const dir = recordDir(runtimeDir);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `${rec.id}.json`);
  writeFileSync(`${path}.tmp`, JSON.stringify(rec));
  renameSync(`${path}.tmp`, path);
}

/** Delete a VMM's record and the files it owned. */
export function removeRecord(runtimeDir: string, rec: Pick<VmmRecord, "id" | "ownedFiles">): void {
  for (const f of rec.ownedFiles) rmSync(f, { force: true });
  rmSync(join(recordDir(runtimeDir), `${rec.id}.json`), { force: true });
}

/**
 * Kill every VMM a previous run left behind (records in `<runtimeDir>/vmm/`), wait for each to
 * die (bounded by `timeoutMs` per process) and delete its files.
 * Scope: only the records directly in `<runtimeDir>/vmm/` (no other directory, no search by
 * process name), and only a pid whose start time matches its record; another node on the host
 * with its own runtime path keeps its VMMs. Two live nodes sharing one runtime path would reap
 * each other's VMMs: that takes a node-wide lock, outside this module.
 * @returns the ids of the records reaped (processes killed or already gone).
 */
export async function reapLeftovers(runtimeDir: string, timeoutMs = 3000): Promise<string[]> {
  const dir = recordDir(runtimeDir);
  if (!existsSync(dir)) return [];
  const reaped: string[] = [];
  for (const f of readdirSync(dir)) {
    if (!f.endsWith(".json")) continue;
    let rec: VmmRecord;
    try {
      rec = JSON.parse(readFileSync(join(dir, f), "utf8"));
    } catch {
      rmSync(join(dir, f), { force: true });
      continue;
    }
    if (processStartTime(rec.pid) === rec.startTime) {
      log.warn({ id: rec.id, pid: rec.pid, driver: rec.driver }, "killing leftover VMM");
      try {
        process.kill(rec.pid, "SIGKILL");
      } catch {
        // already gone
      }
      await waitExit(rec.pid, timeoutMs, rec.startTime);
    }
    removeRecord(runtimeDir, { id: rec.id, ownedFiles: Array.isArray(rec.ownedFiles) ? rec.ownedFiles : [] });
    reaped.push(rec.id);
  }
  return reaped;
}
