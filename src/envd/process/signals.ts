/**
 * Exit status text in the form E2B's envd reports it (Go's `os.ProcessState.String()`:
 * `exit status 3`, `signal: killed`), since SDK users see it as the error message.
 */

// Go's syscall signal names (src/syscall/zerrors_linux_amd64.go, signal table).
const GO_SIGNAL_TEXT: Record<string, string> = {
  SIGHUP: "hangup",
  SIGINT: "interrupt",
  SIGQUIT: "quit",
  SIGILL: "illegal instruction",
  SIGTRAP: "trace/breakpoint trap",
  SIGABRT: "aborted",
  SIGBUS: "bus error",
  SIGFPE: "floating point exception",
  SIGKILL: "killed",
  SIGUSR1: "user defined signal 1",
  SIGSEGV: "segmentation fault",
  SIGUSR2: "user defined signal 2",
  SIGPIPE: "broken pipe",
  SIGALRM: "alarm clock",
  SIGTERM: "terminated",
};

/** `exit status N` or `signal: <name>`. */
export function exitStatusText(exitCode: number | null, signal: string | null): string {
  if (signal) return `signal: ${GO_SIGNAL_TEXT[signal] ?? signal.toLowerCase()}`;
  return `exit status ${exitCode ?? -1}`;
}
