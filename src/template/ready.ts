/**
 * Ready checks the guest can run without the image's userland. The SDK's `waitForPort(p)` sends
 * `[ -n "$(ss -Htuln sport = :p)" ]` (../shared/docs/template-build.md §1), which needs `ss`
 * (iproute2) that slim images lack; it is replaced by a look at /proc/net/tcp{,6} and udp for a
 * socket bound to that port (TCP in LISTEN, state 0A), which needs only `grep`. Other commands
 * run as given.
 */

const SS_PORT_RE = /^\s*\[\s+-n\s+"\$\(ss\s+-Htuln\s+sport\s+=\s+:(\d{1,5})\)"\s+\]\s*$/;

/** The shell text to poll for `readyCmd`. */
export function readyProbe(readyCmd: string): string {
  const m = SS_PORT_RE.exec(readyCmd);
  if (!m) return readyCmd;
  const hex = Number(m[1]).toString(16).toUpperCase().padStart(4, "0");
  // sl local_address rem_address st ...: a TCP listener (0A) or a bound UDP socket (07) on the port
  return `grep -qE '^ *[0-9]+: [0-9A-F]+:${hex} [0-9A-F]+:[0-9A-F]+ (0A|07) ' /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6 2>/dev/null`;
}
