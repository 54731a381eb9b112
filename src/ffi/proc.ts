/**
 * Facts about processes read from procfs (proc(5)).
 */
import { readFileSync } from "node:fs";

/** Start time of a live process (/proc/<pid>/stat field 22, clock ticks since boot), or null when it does not exist. */
export function processStartTime(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // comm (field 2) may contain spaces and parentheses: fields after the last ')' start at field 3
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return Number(rest[22 - 3]);
  } catch {
    return null;
  }
}

/**
 * True when process `pid` exists and is not a zombie (state Z or X, /proc/<pid>/stat field 3):
 * it runs, whoever owns it. A zombie has ended; only its parent's wait is missing.
 */
export function processAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return !/^\d+ \(.*\) [ZX] /s.test(stat);
  } catch {
    return false;
  }
}
