/**
 * Runs the standard tools (`ip`, `iptables-restore`, `iptables-save`) with a time limit.
 * One invocation carries a whole batch (`ip -batch -`, an iptables-restore script on stdin), so a
 * slot is built with a handful of process spawns rather than one per rule.
 */
import { NetError } from "./errors.ts";

/** Result of a finished command. */
export interface RunResult {
  rc: number;
  stdout: string;
  stderr: string;
}

/**
 * Run `cmd` with optional stdin; kill it with SIGKILL after `timeoutMs`.
 * @param opts.check throw when rc ≠ 0 (default true).
 * @throws NetError `net.command_failed` (rc ≠ 0 and check) or `net.timeout`, with cmd, rc, stderr.
 */
export async function run(cmd: string[], opts: { stdin?: string; timeoutMs: number; check?: boolean }): Promise<RunResult> {
  const proc = Bun.spawn(cmd, {
    stdin: opts.stdin === undefined ? "ignore" : new TextEncoder().encode(opts.stdin),
    stdout: "pipe",
    stderr: "pipe",
  });
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    proc.kill("SIGKILL");
  }, opts.timeoutMs);
  try {
    const [stdout, stderr, rc] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
    if (timedOut) throw new NetError("net.timeout", `${cmd.join(" ")} took longer than ${opts.timeoutMs} ms`, { cmd, timeoutMs: opts.timeoutMs });
    if (rc !== 0 && opts.check !== false) {
      throw new NetError("net.command_failed", `${cmd.join(" ")} exited ${rc}: ${stderr.trim()}`, { cmd, rc, stderr: stderr.trim(), stdin: opts.stdin });
    }
    return { rc, stdout, stderr };
  } finally {
    clearTimeout(timer);
  }
}
