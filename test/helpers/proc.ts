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

/** The state letter of a process (/proc/<pid>/stat field 3: R, S, D, Z, ...), or "gone" once it is reaped. */
export function stateOf(pid: number): string {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0]!;
  } catch {
    return "gone";
  }
}

/** True once a process has exited: a zombie its parent has not reaped yet, or gone. */
export function exited(pid: number): boolean {
  return ["Z", "X", "gone"].includes(stateOf(pid));
}

/** First line a child prints on stdout (`Bun.spawn` with `stdout: "pipe"`). */
export async function firstLine(p: { stdout: unknown }): Promise<string> {
  const reader = (p.stdout as ReadableStream<Uint8Array>).getReader();
  let text = "";
  while (!text.includes("\n")) {
    const r = await reader.read();
    if (r.done) break;
    text += new TextDecoder().decode(r.value);
  }
  reader.releaseLock();
  return text.split("\n")[0]!;
}
