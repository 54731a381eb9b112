/**
 * How every long-running command (`agentenv server`, `scheduler`, `gateway`, `cluster up`)
 * ends: on SIGINT, SIGTERM or SIGHUP (a closed terminal: VMs and disk servers run in their own
 * sessions and must be stopped through us), or — when the environment says
 * `AENV_STOP_ON_STDIN_EOF=1` — when stdin reaches its end. `agentenv cluster up` starts its
 * members that way with a pipe as stdin: the kernel closes the pipe when cluster up dies, even
 * by SIGKILL, so no member outlives it.
 */
import { log } from "../observability/log.ts";

/** Environment variable that makes stdin's end a stop request (value "1"). */
export const STOP_ON_STDIN_EOF_ENV = "AENV_STOP_ON_STDIN_EOF";

/**
 * Wait for a stop request, run `close` once, exit 0 (1 when `close` throws). Never returns. The
 * signal handlers are installed by the call itself (synchronously), so call it before announcing
 * readiness (a banner) and await it after: a SIGTERM sent on reading the banner is then a stop,
 * never the default action (exit by signal, nothing closed).
 * @param what names the service in the log line ("node", "scheduler", ...)
 */
export async function runUntilStopped(what: string, close: () => Promise<void>): Promise<never> {
  let stopping = false;
  const stop = (why: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ reason: why }, `${what} shutting down`);
    close().then(
      () => process.exit(0),
      (err) => {
        log.error({ err }, `${what} shutdown failed`);
        process.exit(1);
      },
    );
  };
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(sig, () => stop(sig));
  if (process.env[STOP_ON_STDIN_EOF_ENV] === "1") {
    void (async () => {
      try {
        for await (const _ of Bun.stdin.stream()) {
          // nothing is read from stdin: it only tells whether the parent is alive
        }
      } finally {
        stop("stdin closed: the parent process is gone");
      }
    })();
  }
  return new Promise<never>(() => {});
}
