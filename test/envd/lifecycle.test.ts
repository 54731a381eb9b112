/**
 * envd process lifecycle: SIGTERM to `agentenv envd` stops it cleanly, killing and reaping the
 * processes it started (no orphans left running). Real envd child, real processes.
 */
import { expect, test } from "bun:test";
import { initEnvd, procState, startEnvdChild, waitFor } from "./harness.ts";

test("SIGTERM stops envd and takes its processes with it", async () => {
  const envd = await startEnvdChild();
  try {
    expect((await initEnvd(envd.url, { defaultUser: "root" })).status).toBe(204);
    const envelope = (msg: unknown) => {
      const b = Buffer.from(JSON.stringify(msg));
      const f = Buffer.alloc(5 + b.length);
      f.writeUInt32BE(b.length, 1);
      b.copy(f, 5);
      return f;
    };
    const pids: number[] = [];
    for (const pty of [false, true]) {
      const ac = new AbortController();
      const res = await fetch(`${envd.url}/process.Process/Start`, {
        method: "POST",
        headers: { "content-type": "application/connect+json", "connect-protocol-version": "1" },
        body: envelope({ process: { cmd: "/bin/sleep", args: ["60"] }, ...(pty ? { pty: { size: { cols: 80, rows: 24 } } } : {}) }),
        signal: ac.signal,
      });
      const reader = res.body!.getReader();
      const first = (await reader.read()).value!;
      const msg = JSON.parse(Buffer.from(first.subarray(5, 5 + Buffer.from(first).readUInt32BE(1))).toString());
      pids.push(msg.event.start.pid);
      ac.abort();
    }
    for (const pid of pids) expect(procState(pid)).toBeDefined();
    envd.proc.kill("SIGTERM");
    expect(await envd.proc.exited).toBe(0);
    for (const pid of pids) expect(await waitFor(() => procState(pid) === undefined, 3000)).toBe(true);
  } finally {
    if (envd.proc.exitCode === null) await envd.stop();
  }
}, 30_000);
