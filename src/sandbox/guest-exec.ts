/**
 * Run one command in a sandbox as root through its envd and collect stdout and stderr apart
 * (bounded), on top of envd-client's `runInGuest`: the node's own way to act inside a guest
 * (mount a volume, flush before a kill, file operations on a mounted volume).
 */
import { runInGuest } from "./envd-client.ts";

/** How a command ended: its exit code (-1 when killed by a signal) and its output, each cut at the bound. */
export interface GuestOutput {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/**
 * Run `cmd args` as root in the guest whose envd answers at `base`.
 * @param timeoutMs bound on the whole command
 * @param maxBytes bound on each of stdout and stderr kept (characters); more is dropped
 * @throws OrchestratorError `orchestrator.envd_failed` when envd refuses it, the stream breaks or the time runs out
 */
export async function execInGuest(base: string, token: string | null, cmd: string, args: string[], timeoutMs: number, maxBytes = 65_536): Promise<GuestOutput> {
  const out = { stdout: "", stderr: "" };
  const r = await runInGuest(base, { cmd, args, user: "root", accessToken: token }, AbortSignal.timeout(timeoutMs), (stream, text) => {
    if (out[stream].length < maxBytes) out[stream] = (out[stream] + text).slice(0, maxBytes);
  }, 0);
  return { exitCode: r.exitCode, ...out };
}
