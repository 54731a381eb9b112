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
