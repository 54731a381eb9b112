/** Minimal client for the guest's envd in VM tests: /health and process.Process/Start over Connect. */
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { Process } from "../../../src/envd/gen/process_pb.ts";
import { waitFor } from "../../helpers/wait.ts";

export { ENVD_PORT } from "../../../src/envd/version.ts";

/** Wait until GET <base>/health answers 2xx; returns ms waited. */
export async function waitEnvd(base: string, timeoutMs: number): Promise<number> {
  const t0 = performance.now();
  await waitFor(`envd at ${base}`, async () => {
    try {
      const r = await fetch(`${base}/health`, { signal: AbortSignal.timeout(1000) });
      return r.ok;
    } catch {
      return false;
    }
  }, { timeoutMs: timeoutMs });
  return performance.now() - t0;
}

/** Output of one command run through envd. */
export interface RunResult {
  stdout: string;
  stderr: string;
  exitCode: number;
}

/** Run `/bin/sh -c script` in the guest as `user` (Basic auth names the acting user). */
export async function runInGuest(base: string, script: string, user = "root"): Promise<RunResult> {
  const transport = createConnectTransport({
    baseUrl: base,
    httpVersion: "1.1",
    useBinaryFormat: true,
    interceptors: [
      (next) => async (req) => {
        req.header.set("authorization", `Basic ${btoa(`${user}:`)}`);
        return next(req);
      },
    ],
  });
  const proc = createClient(Process, transport);
  const dec = new TextDecoder();
  const res: RunResult = { stdout: "", stderr: "", exitCode: -1 };
  for await (const m of proc.start({ process: { cmd: "/bin/sh", args: ["-c", script] }, stdin: false }, { timeoutMs: 60_000 })) {
    const ev = m.event!.event;
    if (ev.case === "data" && ev.value.output.case === "stdout") res.stdout += dec.decode(ev.value.output.value);
    if (ev.case === "data" && ev.value.output.case === "stderr") res.stderr += dec.decode(ev.value.output.value);
    if (ev.case === "end") res.exitCode = ev.value.exitCode;
  }
  return res;
}
