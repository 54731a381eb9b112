/**
 * A PTY process in a sandbox through envd's process service (Connect protocol over HTTP/1.1,
 * JSON codec; ../shared/docs/e2b-contract.md §4.2 and src/envd/proto/process.proto):
 * `Start` with a `pty` size opens a server stream of start / data{pty} / end events; keyboard
 * input is `SendInput {input: {pty}}` (unary, sent one at a time so bytes keep their order),
 * a resize is `Update {pty: {size}}`, and closing kills the process (`SendSignal SIGKILL`), as
 * the E2B SDK's `pty.kill` does.
 */
import { connectEnvelope, processStream, type ProcessStreamMessage } from "../sandbox/connect-frames.ts";
import { textCapped } from "../util/read-capped.ts";
import { errorMessage } from "../util/error.ts";
import { ConsoleError } from "./errors.ts";

/** Where a sandbox's envd answers and the token it wants (null: an open envd). */
export interface EnvdTarget {
  /** `http://host:port` of envd. */
  base: string;
  token: string | null;
}

/** What to run on the PTY. */
export interface PtySpec {
  cols: number;
  rows: number;
  /** Guest user (envd's Basic-auth user). */
  user: string;
  cmd: string;
  args: string[];
  cwd?: string;
  envs: Record<string, string>;
}

/** An event of the PTY process stream. */
export type PtyEvent = { kind: "data"; bytes: Uint8Array } | { kind: "exit"; exitCode: number; status: string };

/** Bound on one unary call to envd (input, resize, kill), ms: envd answers these at once. */
const ENVD_CALL_TIMEOUT_MS = 10_000;

/** The default shell: an interactive login bash, as the E2B SDK's `pty.create` starts. */
export const DEFAULT_SHELL = { cmd: "/bin/bash", args: ["-i", "-l"], envs: { TERM: "xterm-256color", LANG: "C.UTF-8", LC_ALL: "C.UTF-8" } } as const;

/** A running PTY process; `close()` kills it and ends the stream. */
export class EnvdPty {
  private inputQueue: Uint8Array[] = [];
  private sending = false;
  private closed = false;

  private constructor(
    private readonly target: EnvdTarget,
    private readonly user: string,
    readonly pid: number,
    private readonly stream: AsyncGenerator<ProcessStreamMessage>,
    private readonly abort: AbortController,
    readonly sandboxId: string,
  ) {}

  /**
   * Start the process and wait for its start event.
   * @throws ConsoleError `console.envd_failed` when envd refuses the call or the stream ends first.
   */
  static async start(sandboxId: string, target: EnvdTarget, spec: PtySpec): Promise<EnvdPty> {
    const abort = new AbortController();
    const body = {
      process: { cmd: spec.cmd, args: spec.args, envs: spec.envs, ...(spec.cwd ? { cwd: spec.cwd } : {}) },
      pty: { size: { cols: spec.cols, rows: spec.rows } },
      stdin: true,
    };
    let res: Response;
    try {
      res = await fetch(`${target.base}/process.Process/Start`, { method: "POST", headers: { ...headers(target, spec.user), "content-type": "application/connect+json" }, body: connectEnvelope(body), signal: abort.signal });
    } catch (e) {
      throw new ConsoleError("console.envd_failed", `envd process start failed: ${errorMessage(e)}`, { sandboxId });
    }
    if (!res.ok || !res.body) {
      const text = await textCapped(res, 4096);
      throw new ConsoleError("console.envd_failed", `envd process start answered ${res.status}: ${text.slice(0, 300)}`, { sandboxId, status: res.status });
    }
    const stream = processStream(res.body);
    for (;;) {
      let f: IteratorResult<ProcessStreamMessage>;
      try {
        f = await stream.next();
      } catch (e) {
        abort.abort();
        throw new ConsoleError("console.envd_failed", `envd process stream broke before the start event: ${e instanceof Error ? e.message : String(e)}`, { sandboxId });
      }
      if (f.done || f.value.end) {
        abort.abort();
        const err = f.done || !f.value.end ? null : f.value.error;
        throw new ConsoleError("console.envd_failed", `envd ended the process stream before the start event${err ? `: ${err.code}: ${err.message}` : ""}`, { sandboxId });
      }
      const pid = f.value.event.start?.pid;
      if (typeof pid === "number") return new EnvdPty(target, spec.user, pid, stream, abort, sandboxId);
    }
  }

  /**
   * Output and the exit, as they come; ends after the exit event or when the stream breaks
   * (then it throws ConsoleError `console.envd_failed`, unless `close()` was called).
   */
  async *events(): AsyncGenerator<PtyEvent> {
    try {
      for await (const f of this.stream) {
        if (f.end) {
          const err = f.error;
          if (err && !this.closed) throw new ConsoleError("console.envd_failed", `envd ended the process stream: ${err.code}: ${err.message}`, { sandboxId: this.sandboxId });
          return;
        }
        const ev = f.event;
        if (ev.data?.pty) yield { kind: "data", bytes: Buffer.from(ev.data.pty, "base64") };
        if (ev.end) {
          yield { kind: "exit", exitCode: typeof ev.end.exitCode === "number" ? ev.end.exitCode : ev.end.exited === false ? -1 : 0, status: String(ev.end.status ?? "") };
          return;
        }
      }
    } catch (e) {
      if (this.closed) return;
      if (e instanceof ConsoleError) throw e;
      throw new ConsoleError("console.envd_failed", `the process stream broke: ${errorMessage(e)}`, { sandboxId: this.sandboxId });
    }
  }

  /** Queue keyboard input; sent in order, batched while a send is in flight. */
  input(bytes: Uint8Array): void {
    if (this.closed || bytes.length === 0) return;
    this.inputQueue.push(bytes);
    if (!this.sending) void this.drainInput();
  }

  /** Tell envd the new size (character cells). */
  async resize(cols: number, rows: number): Promise<void> {
    if (this.closed) return;
    await this.unary("Update", { process: { pid: this.pid }, pty: { size: { cols, rows } } });
  }

  /** Kill the process (SIGKILL) and stop reading its stream. Safe to call twice. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.unary("SendSignal", { process: { pid: this.pid }, signal: "SIGNAL_SIGKILL" });
    } catch {
      // the process may have exited, or the sandbox gone: nothing left to kill
    }
    this.abort.abort();
  }

  private async drainInput(): Promise<void> {
    this.sending = true;
    try {
      while (this.inputQueue.length && !this.closed) {
        const parts = this.inputQueue;
        this.inputQueue = [];
        const all = Buffer.concat(parts);
        await this.unary("SendInput", { process: { pid: this.pid }, input: { pty: all.toString("base64") } });
      }
    } catch {
      // a failed send means the process or the sandbox is gone; the stream reports the end
    } finally {
      this.sending = false;
    }
  }

  private async unary(method: string, body: unknown): Promise<void> {
    const res = await fetch(`${this.target.base}/process.Process/${method}`, {
      method: "POST",
      headers: { ...headers(this.target, this.user), "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(ENVD_CALL_TIMEOUT_MS),
    });
    const text = await res.text();
    if (!res.ok) throw new ConsoleError("console.envd_failed", `envd ${method} answered ${res.status}: ${text.slice(0, 200)}`, { sandboxId: this.sandboxId, status: res.status });
  }
}

function headers(t: EnvdTarget, user: string): Record<string, string> {
  return {
    "connect-protocol-version": "1",
    authorization: `Basic ${Buffer.from(`${user}:`).toString("base64")}`,
    ...(t.token ? { "x-access-token": t.token } : {}),
  };
}
