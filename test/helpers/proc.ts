// Process facts the integration tests check: liveness and process group / session.
import { readFileSync } from "node:fs";

/** True while a process with this pid exists (signal 0 probe). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** pgid and sid of a live process: fields 5 and 6 of /proc/<pid>/stat (proc(5)). */
export function groupOf(pid: number): { pgid: number; sid: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return { pgid: Number(f[5 - 3]), sid: Number(f[6 - 3]) };
}
