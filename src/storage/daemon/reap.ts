/**
 * Start-up reconciliation: find serving children and FUSE mounts left by a crashed node,
 * kill the children, detach the mounts, remove the records.
 */
import { readFileSync } from "node:fs";
import { listMounts, MNT_DETACH, umount2 } from "../../ffi/mount.ts";
import { logger } from "../../observability/log.ts";
import { FUSE_FS_NAME } from "../fuse/server.ts";
import { listRecords, removeRecord } from "./record.ts";

const log = logger("disk");

/** What `reapStaleDisks` did. */
export interface ReapReport {
  /** pids of serving children that were killed. */
  killed: number[];
  /** mount points that were detached. */
  unmounted: string[];
  /** record files removed. */
  records: number;
}

/** True when `pid` is a live `agentenv disk serve` process for disk `id`. */
function isOurServer(pid: number, id: string): boolean {
  let cmd: string;
  try {
    cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
  } catch {
    return false;
  }
  const args = cmd.split("\0");
  const i = args.indexOf("disk");
  return i >= 0 && args[i + 1] === "serve" && args.some((a) => a.endsWith(`disk-${id}.json`));
}

async function waitGone(pid: number, timeoutMs: number): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      process.kill(pid, 0);
    } catch {
      return true;
    }
    if (Date.now() > end) return false;
    await Bun.sleep(10);
  }
}

/**
 * Reap every disk export recorded in `recordDir` (`<runtime_path>/disks`): SIGKILL its child
 * when still running (a pid that now belongs to another program is left alone), detach its
 * mount, delete the record. Then detach every other `fuse.aenvdisk` mount found under one of
 * `mountRoots` (absolute prefixes, e.g. the sandboxes directory). Call once at node start,
 * before any new disk is exported.
 */
export async function reapStaleDisks(recordDir: string, opts: { mountRoots?: string[] } = {}): Promise<ReapReport> {
  const report: ReapReport = { killed: [], unmounted: [], records: 0 };
  const mounts = new Set(listMounts().filter((m) => m.fstype === `fuse.${FUSE_FS_NAME}`).map((m) => m.mountPoint));
  for (const { file, record } of listRecords(recordDir)) {
    if (record) {
      if (isOurServer(record.pid, record.id)) {
        process.kill(record.pid, "SIGKILL");
        if (!(await waitGone(record.pid, 5000))) log.warn({ pid: record.pid }, "stale disk server did not die");
        report.killed.push(record.pid);
      }
      if (mounts.has(record.mountPoint) && umount2(record.mountPoint, MNT_DETACH) === 0) {
        report.unmounted.push(record.mountPoint);
        mounts.delete(record.mountPoint);
      }
      removeRecord(recordDir, record.id);
    } else {
      require("node:fs").rmSync(file, { force: true });
    }
    report.records++;
  }
  const roots = (opts.mountRoots ?? []).map((r) => r.replace(/\/+$/, "") + "/");
  for (const mp of mounts) {
    if (!roots.some((r) => mp.startsWith(r))) continue;
    if (umount2(mp, MNT_DETACH) === 0) report.unmounted.push(mp);
  }
  if (report.killed.length || report.unmounted.length) log.info(report, "reaped stale disk exports");
  return report;
}
