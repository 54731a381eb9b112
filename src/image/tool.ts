/**
 * The one runner of host tools for images and templates (skopeo, umoci, mkfs.ext4, mmdebstrap):
 * bounded in time, cancellable, killed with the node (a parent-death signal through util-linux's
 * `setpriv`, so a crashed node leaves no tool hanging on a dead registry), output lines streamed
 * as progress, the tail of stderr (and stdout) kept for the error. Callers turn the outcome into
 * their own typed error.
 */
import { errorMessage } from "../util/error.ts";

/** How to run one tool. */
export interface ToolOptions {
  /** Bound on the run, ms. */
  timeoutMs: number;
  /** Progress lines: stderr's, and stdout's too with `stdoutLines`. */
  onLine?: (line: string) => void;
  stdoutLines?: boolean;
  /** Aborts the run (build cancelled, node shutting down). */
  signal?: AbortSignal;
  /** Extra environment variables. */
  env?: Record<string, string>;
}

/** How a run ended. */
export interface ToolOutcome {
  /** Exit code (non-zero when killed). */
  code: number;
  /** Whole stdout (unless `stdoutLines`: its last 8000 characters). */
  stdout: string;
  /** Last 8000 characters of stderr. */
  stderr: string;
  /** Killed after `timeoutMs`. */
  timedOut: boolean;
  /** Killed because `signal` aborted. */
  cancelled: boolean;
  /** The program does not exist or cannot be executed. */
  missing: boolean;
}

const TAIL = 8000;

/** Run `cmd` to its end (see the module doc). Never throws for the tool's own failures: read the outcome. */
export async function runTool(cmd: string[], o: ToolOptions): Promise<ToolOutcome> {
  const timeout = AbortSignal.timeout(o.timeoutMs);
  let p: ReturnType<typeof Bun.spawn>;
  try {
    p = Bun.spawn(["setpriv", "--pdeathsig", "KILL", "--", ...cmd], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
      env: { ...process.env, ...o.env },
      signal: AbortSignal.any([timeout, ...(o.signal ? [o.signal] : [])]),
    });
  } catch (e) {
    return { code: 127, stdout: "", stderr: errorMessage(e), timedOut: false, cancelled: false, missing: true };
  }
  const read = async (stream: ReadableStream<Uint8Array>, lines: boolean, keep: number): Promise<string> => {
    let text = "";
    let buf = "";
    const dec = new TextDecoder();
    for await (const c of stream) {
      const s = dec.decode(c, { stream: true });
      text = keep > 0 ? (text + s).slice(-keep) : text + s;
      if (!lines) continue;
      buf += s;
      const ls = buf.split("\n");
      buf = ls.pop()!;
      for (const l of ls) if (l.trim()) o.onLine?.(l.trim());
    }
    if (lines && buf.trim()) o.onLine?.(buf.trim());
    return text;
  };
  const [stdout, stderr, code] = await Promise.all([
    read(p.stdout as ReadableStream<Uint8Array>, !!o.stdoutLines, o.stdoutLines ? TAIL : 0),
    read(p.stderr as ReadableStream<Uint8Array>, true, TAIL),
    p.exited,
  ]);
  const missing = code === 127 && /setpriv: failed to execute/.test(stderr);
  return { code, stdout, stderr, timedOut: code !== 0 && timeout.aborted, cancelled: code !== 0 && !timeout.aborted && !!o.signal?.aborted, missing };
}
