/**
 * Waiting for a started VM's envd (guest port 49983) to answer `GET /health` (204), raced against
 * the VM's exit: a VMM that dies ends the wait at once, not at the next poll.
 * Facts: e2b-contract.md §3.2.
 */
import { OrchestratorError } from "../orchestrator/errors.ts";
import { errorMessage } from "../util/error.ts";
import { pauseFor } from "./pause-for.ts";

/**
 * Poll `base/health` every `pollMs` until it answers 2xx. One request is bounded by
 * max(10 polls, 500 ms); `gone` resolving (the VM exited) aborts the request in flight and the
 * wait.
 * @throws OrchestratorError `orchestrator.envd_unready` when `gone` resolves (the VM died) or
 *   `signal` aborts first, carrying the last error seen.
 */
export async function waitEnvdHealthy(base: string, pollMs: number, signal: AbortSignal, gone?: Promise<unknown>): Promise<void> {
  const exit = new AbortController();
  void gone?.then(() => exit.abort());
  const ended = AbortSignal.any([signal, exit.signal]);
  let last = "no answer yet";
  for (;;) {
    if (exit.signal.aborted) throw new OrchestratorError("orchestrator.envd_unready", `the sandbox VM exited before envd answered (${last})`, { base });
    if (signal.aborted) throw new OrchestratorError("orchestrator.envd_unready", `envd at ${base} not ready in time (${last})`, { base });
    try {
      const res = await fetch(`${base}/health`, { signal: AbortSignal.any([ended, AbortSignal.timeout(Math.max(pollMs * 10, 500))]) });
      await res.arrayBuffer();
      if (res.ok) return;
      last = `HTTP ${res.status}`;
    } catch (e) {
      // an abort says nothing about envd: the error before it does
      if (!ended.aborted) last = errorMessage(e);
    }
    await pauseFor(pollMs, ended);
  }
}
