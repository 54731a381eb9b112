/**
 * The progress display of `agentenv template build|pull`: every build log line with the time
 * since the start, and on a terminal a status line below them (spinner, the build's current
 * phase — base, step i/n, finalize — and the elapsed time), redrawn as the build goes. Phases
 * are read from the builder's log lines (`[base]`, `[builder i/n]`, `[finalize]`).
 */

const SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏";
/** Status line redraw interval, ms. */
const REDRAW_MS = 120;

/** The phase a build log line announces, or null. */
export function phaseOf(line: string): string | null {
  const step = /\[builder (\d+)\/(\d+)\]/.exec(line);
  if (step) return `step ${step[1]}/${step[2]}${line.startsWith("CACHED") ? " (cached)" : ""}`;
  if (/\[base\]/.test(line)) return "base image";
  if (/\[finalize\]|booting the build VM for the start command/.test(line)) return "finalize";
  if (/^uploading COPY|already on the node$/.test(line)) return "uploading files";
  return null;
}

/** A build's display on `out` (stderr); `tty` draws the status line. */
export class BuildProgress {
  private readonly t0 = performance.now();
  private phase = "starting";
  private frame = 0;
  private timer: ReturnType<typeof setInterval> | undefined;

  constructor(
    private readonly out: { write(s: string): unknown },
    private readonly tty: boolean,
  ) {
    if (tty) this.timer = setInterval(() => this.draw(), REDRAW_MS);
  }

  private elapsed(): string {
    return `${((performance.now() - this.t0) / 1000).toFixed(1)}s`;
  }

  private draw(): void {
    this.frame = (this.frame + 1) % SPINNER.length;
    this.out.write(`\r\x1b[K${SPINNER[this.frame]} building: ${this.phase} · ${this.elapsed()}`);
  }

  /** Print one log line (above the status line). */
  log(line: string): void {
    this.phase = phaseOf(line) ?? this.phase;
    const text = `[${this.elapsed().padStart(7)}] ${line}\n`;
    if (!this.tty) return void this.out.write(text);
    this.out.write(`\r\x1b[K${text}`);
    this.draw();
  }

  /** Stop drawing and clear the status line. */
  done(): void {
    clearInterval(this.timer);
    if (this.tty) this.out.write("\r\x1b[K");
  }
}
