/**
 * VMM process records and reaping. Each running VMM has `<runtimeDir>/vmm/<id>.json` holding its
 * pid, its start time (field 22 of /proc/<pid>/stat, clock ticks since host boot: tells a live
 * VMM from a recycled pid), its command line, the files it owns and what a node needs to take it
 * over (control socket, console, work dir). A node that crashed leaves these behind; at start-up
 * a node either adopts a VMM from its record (the driver's `attach`, ./adopt.ts) or kills it
 * (`reapLeftovers`, for every record nobody claims).
 */
import { processStartTime } from "../ffi/proc.ts";
import { waitExit } from "../ffi/pidfd.ts";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { logger } from "../observability/log.ts";
import { writeFileDurable } from "../util/durable.ts";

const log = logger("vmm.supervise");

/** What a VMM record file holds. Fields after `ownedFiles` are absent in records of older nodes. */
export interface VmmRecord {
  id: string;
  driver: "qemu" | "firecracker";
  pid: number;
  /** /proc/<pid>/stat field 22 (starttime, clock ticks). */
  startTime: number;
  /** Files and sockets to delete when the VMM is gone (RAM file, control socket, ...). */
  ownedFiles: string[];
  /**
   * The VMM's own argv as the driver built it (after any nsenter): adoption requires
   * /proc/<pid>/cmdline to end with `argv.slice(1)` (argv[0] may be resolved or wrapped).
   */
  argv?: string[];
  /** The VM's work directory (console log, driver files). */
  workDir?: string;
  /** QMP socket (QEMU) or API socket (Firecracker). */
  controlSocket?: string;
  /** QEMU: Unix socket of the guest serial console (the node is its client). */
  consoleSocket?: string;
  /** Guest console log file (QEMU: the node appends what it reads; Firecracker: the VMM writes it). */
  consolePath?: string;
  /** QEMU: the file QEMU's stdout and stderr go to. */
  logPath?: string;
  /** QEMU: guest RAM file and whether it is mapped shared (booted) or privately (restored). */
  memPath?: string;
  memShared?: boolean;
  /** Firecracker: started from a snapshot, and the sparse file its Diff snapshots merge into. */
  restored?: boolean;
  dirtyMemPath?: string;
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
  writeFileDurable(path, JSON.stringify(rec));
}

/** Delete a VMM's record and the files it owned. */
export function removeRecord(runtimeDir: string, rec: Pick<VmmRecord, "id" | "ownedFiles">): void {
  for (const f of rec.ownedFiles) rmSync(f, { force: true });
  rmSync(join(recordDir(runtimeDir), `${rec.id}.json`), { force: true });
}

/** True when `v` has the fields every record has had (id, driver, pid, start time, owned files). */
function isRecord(v: unknown): v is VmmRecord {
  const r = v as Partial<VmmRecord> | null;
  return (
    typeof r === "object" && r !== null && typeof r.id === "string" && (r.driver === "qemu" || r.driver === "firecracker") &&
    Number.isSafeInteger(r.pid) && Number.isSafeInteger(r.startTime) && Array.isArray(r.ownedFiles)
  );
}

/**
 * The records under `<runtimeDir>/vmm/` (a previous node's VMMs, before any is adopted or reaped),
 * by sandbox id. A file that is not a record (unparseable, fields missing) is deleted and skipped.
 */
export function readRecords(runtimeDir: string): Map<string, VmmRecord> {
  const dir = recordDir(runtimeDir);
  const out = new Map<string, VmmRecord>();
  if (!existsSync(dir)) return out;
  for (const f of readdirSync(dir)) {
    if (!f.endsWith(".json")) continue;
    let rec: unknown;
    try {
      rec = JSON.parse(readFileSync(join(dir, f), "utf8"));
    } catch {
      rec = null;
    }
    if (!isRecord(rec) || `${rec.id}.json` !== f) {
      log.warn({ file: f }, "dropping an unreadable VMM record");
      rmSync(join(dir, f), { force: true });
      continue;
    }
    out.set(rec.id, rec);
  }
  return out;
}

/**
 * Kill every VMM a previous run left behind (records in `<runtimeDir>/vmm/`) except those whose
 * id is in `keep` (adopted ones: their handles own the records now), wait for each to die
 * (bounded by `timeoutMs` per process) and delete its files.
 * Scope: only the records directly in `<runtimeDir>/vmm/` (no other directory, no search by
 * process name), and only a pid whose start time matches its record; another node on the host
 * with its own runtime path keeps its VMMs. Two live nodes sharing one runtime path would reap
 * each other's VMMs: that takes a node-wide lock, outside this module.
 * @returns the ids of the records reaped (processes killed or already gone).
 */
export async function reapLeftovers(runtimeDir: string, opts: { keep?: ReadonlySet<string>; timeoutMs?: number } = {}): Promise<string[]> {
  const timeoutMs = opts.timeoutMs ?? 3000;
  const reaped: string[] = [];
  for (const rec of readRecords(runtimeDir).values()) {
    if (opts.keep?.has(rec.id)) continue;
    if (processStartTime(rec.pid) === rec.startTime) {
      log.warn({ id: rec.id, pid: rec.pid, driver: rec.driver }, "killing leftover VMM");
      try {
        process.kill(rec.pid, "SIGKILL");
      } catch {
        // already gone
      }
      await waitExit(rec.pid, timeoutMs, rec.startTime);
    }
    removeRecord(runtimeDir, rec);
    reaped.push(rec.id);
  }
  return reaped;
}
