/**
 * Ready checks the guest can run without the image's userland. The SDK's `waitForPort(p)` sends
 * `[ -n "$(ss -Htuln sport = :p)" ]` (../shared/docs/template-build.md §1), which needs `ss`
 * (iproute2) that slim images lack; it is replaced by a look at /proc/net/tcp{,6} and udp for a
 * socket bound to that port (TCP in LISTEN, state 0A), which needs only `grep`. `waitForURL`
 * (curl) falls back to `wget -S` where the image has no curl. Other commands run as given.
 */

const SS_PORT_RE = /^\s*\[\s+-n\s+"\$\(ss\s+-Htuln\s+sport\s+=\s+:(\d{1,5})\)"\s+\]\s*$/;
/** `waitForURL(u, c)`: `curl -s -o /dev/null -w "%{http_code}" 'u' | grep -q "c"`. */
const CURL_URL_RE = /^\s*curl\s+-s\s+-o\s+\/dev\/null\s+-w\s+"%\{http_code\}"\s+'([^']*)'\s+\|\s+grep\s+-q\s+"(\d{3})"\s*$/;

/** The shell text to poll for `readyCmd`. */
export function readyProbe(readyCmd: string): string {
  const u = CURL_URL_RE.exec(readyCmd);
  // without curl (busybox, Alpine), wget -S prints the status line to stderr
  if (u) return `if command -v curl >/dev/null 2>&1; then ${readyCmd}; else wget -q -S -O /dev/null '${u[1]}' 2>&1 | grep -q "HTTP/[0-9.]* ${u[2]}"; fi`;
  const m = SS_PORT_RE.exec(readyCmd);
  if (!m) return readyCmd;
  const hex = Number(m[1]).toString(16).toUpperCase().padStart(4, "0");
  // sl local_address rem_address st ...: a TCP listener (0A) or a bound UDP socket (07) on the port
  return `grep -qE '^ *[0-9]+: [0-9A-F]+:${hex} [0-9A-F]+:[0-9A-F]+ (0A|07) ' /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6 2>/dev/null`;
}

/** How `waitReady` ended. */
export interface ReadyOutcome {
  ok: boolean;
  /** Why the start command counts as failed (from `startFailure`), when that ended the wait. */
  startFailure?: string;
  /** Output of the last failed probe. */
  lastOutput: string;
}

/**
 * Poll `readyCmd` (through `readyProbe`) with `run` every `pollMs` until it exits 0, the start
 * command fails (`startFailure()` returns a reason) or `timeoutMs` passes. One loop for builds and
 * sandbox starts. Each probe is bounded by `probeTimeoutMs` (and what is left of `timeoutMs`).
 * @throws whatever `run` throws (envd unreachable) or `signal`'s reason.
 */
export async function waitReady(o: {
  readyCmd: string;
  run: (script: string, timeoutMs: number) => Promise<{ exitCode: number; output: string }>;
  startFailure: () => string | null;
  timeoutMs: number;
  pollMs: number;
  probeTimeoutMs: number;
  signal: AbortSignal;
}): Promise<ReadyOutcome> {
  const probe = readyProbe(o.readyCmd);
  const end = Date.now() + o.timeoutMs;
  let lastOutput = "";
  for (;;) {
    o.signal.throwIfAborted();
    const failed = o.startFailure();
    if (failed) return { ok: false, startFailure: failed, lastOutput };
    const r = await o.run(probe, Math.max(1000, Math.min(o.probeTimeoutMs, end - Date.now())));
    if (r.exitCode === 0) return { ok: true, lastOutput: "" };
    lastOutput = r.output.trim();
    if (Date.now() >= end) return { ok: false, lastOutput };
    await Bun.sleep(o.pollMs);
  }
}
