/**
 * One process started by envd: spawns it (pipes or a PTY), pumps its output to every attached
 * stream with back-pressure, records the end event, and takes input, signals and resizes.
 * Output ordering per stream: start, data*, end.
 *
 * A process outlives its streams: when the last one goes away (its client's connection dropped,
 * or the node in between restarted), the process is neither killed nor blocked. Its output from
 * then on is kept, the newest `detachedOutputBytes` of it, and handed first to the next stream
 * that attaches (Connect), then the live output follows (issue 27). E2B's envd drops output
 * nobody receives (its fan-out sends to live subscribers only); with the bound at 0 so does this.
 */
import { closeSync } from "node:fs";
import type { FileSink, Subprocess } from "bun";
import { createPipe, type PipeEnds } from "../../ffi/pipe.ts";
import { openPty, resizePty } from "../../ffi/pty.ts";
import { logger } from "../log.ts";
import { EnvdError } from "../errors.ts";
import { EventQueue } from "../queue.ts";
import { freeBuffer } from "../buffers.ts";
import { userGroups, type UserInfo } from "../users.ts";
import { exitStatusText } from "./signals.ts";
import { errorCode, errorMessage } from "../../util/error.ts";

const log = logger("envd.process");

/** The end of a process as the wire reports it (process.proto EndEvent). */
export interface ProcessEnd {
  exitCode: number;
  exited: boolean;
  status: string;
  error?: string;
}

/**
 * What an attached stream receives, in order. A data event is one read of the output (any size;
 * the wire splits it); `holders` counts the streams that still have to send it (see
 * `releaseOutput`).
 */
export type ProcEvent =
  | { kind: "start"; pid: number }
  | { kind: "data"; stream: "stdout" | "stderr" | "pty"; data: Uint8Array; holders: number }
  | { kind: "end"; end: ProcessEnd }
  | { kind: "keepalive" };

/**
 * A stream is done with `ev`: it has sent it (its bytes are in the connection's buffers, or
 * encoded as base64 text), or it went away before taking it. Once every stream it was queued to
 * is done, the read's buffer is freed at once (detached with `ArrayBuffer.prototype.transfer(0)`)
 * instead of waiting for the garbage collector, so the next reads reuse that memory rather than
 * fault in fresh pages (`freeBuffer`). Only a buffer the read owns whole is freed; one that
 * cannot be detached is left to the collector, as is a read a stream was still writing when its
 * client went away (that stream never releases it). Other events are ignored. A release beyond
 * the count is a bug: it is logged and frees nothing.
 */
export function releaseOutput(ev: ProcEvent): void {
  if (ev.kind !== "data") return;
  if (ev.holders <= 0) {
    log.error({ stream: ev.stream, bytes: ev.data.byteLength }, "output read released more often than it was queued");
    return;
  }
  if (--ev.holders === 0) freeBuffer(ev.data);
}

/** Validated spawn parameters (paths absolute, env complete). */
export interface SpawnSpec {
  cmd: string;
  args: string[];
  /** Full child environment. */
  env: Record<string, string>;
  /** Environment the caller asked for (echoed back by List). */
  requestEnvs: Record<string, string>;
  cwd: string;
  /** cwd as the caller gave it (echoed by List). */
  requestCwd?: string;
  user: UserInfo;
  tag?: string;
  stdin: boolean;
  /** Character cells; set => run on a PTY. */
  pty?: { cols: number; rows: number };
}

/** Bounds from config (`[envd]`). */
export interface HandleLimits {
  /** Events buffered per stream before output reading pauses. */
  queueHighWater: number;
  /** Output bytes buffered per stream before output reading pauses (back-pressure to the pipe). */
  queueHighWaterBytes: number;
  /** Output kept while no stream is attached, for the next one (the newest bytes), bytes; 0 = none. */
  detachedOutputBytes: number;
  /** Capacity asked for each stdout/stderr pipe, bytes (the kernel may give less). */
  pipeBytes: number;
  /** After the process exited, output is read until a read waited this long, ms (grandchildren may hold the pipe). */
  outputDrainMs: number;
  /** Absolute path of util-linux `setsid` (PTY sessions). */
  setsidPath: string;
  /** Absolute path of `cat` (PTY master relay). */
  catPath: string;
  /** Absolute path of util-linux `setpriv`, used when the user has supplementary groups. */
  setprivPath?: string;
  /** After a SIGKILL, the longest wait for the process to be reaped before SendSignal answers anyway, ms. */
  killWaitMs: number;
}

/**
 * How to become `user`: Bun's uid/gid spawn options set only the primary group, so a user with
 * supplementary groups is entered through `setpriv --init-groups` (which execs; the pid stays).
 */
function identity(user: UserInfo, limits: HandleLimits): { prefix: string[]; ids: { uid?: number; gid?: number } } {
  if (process.getuid?.() !== 0 || user.uid === 0) return { prefix: [], ids: {} };
  if (limits.setprivPath && userGroups(user).size > 1) {
    return { prefix: [limits.setprivPath, `--reuid=${user.uid}`, `--regid=${user.gid}`, "--init-groups", "--"], ids: {} };
  }
  return { prefix: [], ids: { uid: user.uid, gid: user.gid } };
}

/** Bytes of output an event holds (what the per-stream byte bound counts). */
export function eventBytes(ev: ProcEvent): number {
  return ev.kind === "data" ? ev.data.byteLength : 0;
}

/** The reader side of a process output stream. */
type OutputReader = { read(): Promise<{ done: true; value?: undefined } | { done: false; value: Uint8Array }> };

interface PtyRelay {
  master: number;
  reader: Subprocess<number, "pipe", "ignore">;
  writer: Subprocess<"pipe", number, "ignore">;
}

/** A running or recently exited process. Create with `ProcessHandle.spawn`. */
export class ProcessHandle {
  readonly pid: number;
  readonly spec: SpawnSpec;
  private readonly proc: Subprocess<any, any, any>;
  private readonly relay: PtyRelay | undefined;
  private readonly subscribers = new Set<EventQueue<ProcEvent>>();
  /** Output read while no stream was attached (oldest first), held for the next stream. */
  private detached: Extract<ProcEvent, { kind: "data" }>[] = [];
  private detachedBytes = 0;
  private endEvent: ProcessEnd | undefined;
  private stdinOpen: boolean;
  /** The process itself is gone (its output may still be draining). */
  private exited = false;
  /** Idle timers of pending output reads, armed at exit. */
  private readonly onExit = new Set<() => void>();
  /** Resolves once the end event is recorded and every stream got it. */
  readonly done: Promise<ProcessEnd>;

  private constructor(
    spec: SpawnSpec,
    proc: Subprocess<any, any, any>,
    relay: PtyRelay | undefined,
    private readonly limits: HandleLimits,
    /** Read ends of the output pipes (not a PTY); closed once read to the end. */
    private readonly pipes?: { stdout: number; stderr: number },
  ) {
    this.spec = spec;
    this.proc = proc;
    this.pid = proc.pid;
    this.relay = relay;
    this.stdinOpen = spec.stdin || !!relay;
    this.done = this.run();
  }

  /**
   * Start a process as `spec.user`.
   * @throws EnvdError `invalid_argument` when the executable cannot be started, `internal` when
   *   no PTY can be allocated.
   */
  static spawn(spec: SpawnSpec, limits: HandleLimits): ProcessHandle {
    const { prefix, ids } = identity(spec.user, limits);
    if ((prefix.length || spec.pty) && !Bun.which(spec.cmd, { PATH: spec.env.PATH ?? "", cwd: spec.cwd })) {
      // behind setsid/setpriv a missing program shows only as an exit code; answer like a failed spawn
      throw new EnvdError("invalid_argument", `failed to start process '${spec.cmd}': not found or not executable`, { cmd: spec.cmd, cwd: spec.cwd });
    }
    try {
      if (spec.pty) {
        const { master, slave } = openPty(spec.pty.cols, spec.pty.rows);
        let proc: Subprocess<any, any, any> | undefined;
        let reader: PtyRelay["reader"] | undefined;
        let writer: PtyRelay["writer"];
        try {
          // setsid -c: new session with the PTY as controlling terminal; it execs, so the pid
          // we report is the command's own.
          proc = Bun.spawn([limits.setsidPath, "-c", ...prefix, spec.cmd, ...spec.args], {
            cwd: spec.cwd,
            env: spec.env,
            stdin: slave,
            stdout: slave,
            stderr: slave,
            ...ids,
          });
          // Reads on a PTY master block; Bun would park a pool thread per terminal. Two `cat`
          // relays turn it into pipes Bun polls.
          reader = Bun.spawn([limits.catPath], { stdin: master, stdout: "pipe", stderr: "ignore" });
          writer = Bun.spawn([limits.catPath], { stdin: "pipe", stdout: master, stderr: "ignore" });
        } catch (err) {
          proc?.kill("SIGKILL");
          reader?.kill("SIGKILL");
          closeSync(master);
          throw err;
        } finally {
          closeSync(slave);
        }
        return new ProcessHandle(spec, proc, { master, reader, writer }, limits);
      }
      // stdout and stderr are pipes of envd's own (Bun's "pipe" is a socketpair): see src/ffi/pipe.ts
      const out = createPipe(limits.pipeBytes);
      let err: PipeEnds | undefined;
      let proc: Subprocess<any, any, any>;
      try {
        err = createPipe(limits.pipeBytes);
        proc = Bun.spawn([...prefix, spec.cmd, ...spec.args], {
          cwd: spec.cwd,
          env: spec.env,
          stdin: spec.stdin ? "pipe" : "ignore",
          stdout: out.write,
          stderr: err.write,
          ...ids,
        });
      } catch (e) {
        closeSync(out.read);
        if (err) closeSync(err.read);
        throw e;
      } finally {
        closeSync(out.write);
        if (err) closeSync(err.write);
      }
      return new ProcessHandle(spec, proc, undefined, limits, { stdout: out.read, stderr: err.read });
    } catch (err) {
      if (err instanceof EnvdError) throw err;
      const code = errorCode(err);
      throw new EnvdError(
        code === "EACCES" || code === "ENOENT" || code === "ENOEXEC" ? "invalid_argument" : "internal",
        `failed to start process '${spec.cmd}': ${errorMessage(err)}`,
        { cmd: spec.cmd, cwd: spec.cwd, user: spec.user.name, errno: code },
        { cause: err },
      );
    }
  }

  /** True while the end event has not been recorded. */
  get running(): boolean {
    return this.endEvent === undefined;
  }

  /** The recorded end, once the process is gone. */
  get end(): ProcessEnd | undefined {
    return this.endEvent;
  }

  /** True when started on a PTY. */
  get isPty(): boolean {
    return !!this.relay;
  }

  /**
   * Attach a new stream. It first receives `start{pid}`, then the output kept while no stream
   * was attached (see the module comment); a stream attached after exit gets `start`, that
   * output and the retained `end`, then closes.
   */
  subscribe(): EventQueue<ProcEvent> {
    const q = new EventQueue<ProcEvent>({
      highWater: this.limits.queueHighWater,
      highWaterBytes: this.limits.queueHighWaterBytes,
      weigh: eventBytes,
    });
    q.push({ kind: "start", pid: this.pid });
    // the kept reads move to this stream with their hold (released once it sent them)
    for (const ev of this.detached) q.push(ev);
    this.detached = [];
    this.detachedBytes = 0;
    if (this.endEvent) {
      q.push({ kind: "end", end: this.endEvent });
      q.close();
    } else {
      this.subscribers.add(q);
    }
    return q;
  }

  /** Detach a stream (its consumer went away). */
  unsubscribe(q: EventQueue<ProcEvent>): void {
    this.subscribers.delete(q);
    q.close();
  }

  /**
   * Write to the process: `stdin` data needs a process started with stdin, `pty` data a PTY.
   * @throws EnvdError `internal` when that input is not open (the code E2B's envd uses).
   */
  async write(kind: "stdin" | "pty", data: Uint8Array): Promise<void> {
    if (!this.running) throw new EnvdError("not_found", `process with pid ${this.pid} has exited`, { pid: this.pid });
    if (kind === "pty" && !this.relay) {
      throw new EnvdError("internal", `error writing to tty: process ${this.pid} has no PTY`, { pid: this.pid });
    }
    if (!this.stdinOpen) {
      throw new EnvdError("internal", `error writing to stdin: stdin of process ${this.pid} is not enabled or closed`, { pid: this.pid });
    }
    // Stdin data to a PTY process goes to the terminal too (E2B does the same).
    const sink = this.relay ? this.relay.writer.stdin : (this.proc.stdin as FileSink);
    sink.write(data);
    await sink.flush();
  }

  /**
   * Send EOF on stdin (pipes only; a PTY takes Ctrl-D as data). A process without stdin, or
   * whose stdin is already closed, is left as is.
   * @throws EnvdError `unknown` for a PTY (the code E2B's envd uses).
   */
  async closeStdin(): Promise<void> {
    if (this.relay) throw new EnvdError("unknown", `error closing stdin: process ${this.pid} is a PTY; send Ctrl-D (0x04) instead`, { pid: this.pid });
    if (!this.stdinOpen) return;
    this.stdinOpen = false;
    await (this.proc.stdin as FileSink).end();
  }

  /** Deliver a signal by number; a no-op once the process is gone. */
  signal(signo: number): void {
    if (!this.running) return;
    try {
      process.kill(this.pid, signo);
    } catch (err) {
      if (errorCode(err) !== "ESRCH") throw err;
    }
  }

  /**
   * Deliver `signo`; after SIGKILL, return once the process is reaped (gone from the process
   * table: `kill -0 <pid>` fails), waiting at most `killWaitMs`. E2B's SDK treats `kill()`
   * returning as the process being gone. SIGTERM returns once delivered: the process may handle it.
   * @returns whether the process is gone
   */
  async kill(signo: number): Promise<boolean> {
    this.signal(signo);
    if (signo !== 9) return !this.running;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const gone = await Promise.race([
      this.proc.exited.then(() => true),
      new Promise<boolean>((r) => (timer = setTimeout(() => r(false), this.limits.killWaitMs))),
    ]);
    clearTimeout(timer);
    if (!gone) log.warn({ pid: this.pid, waitedMs: this.limits.killWaitMs }, "process not reaped after SIGKILL within kill_wait_ms");
    return gone;
  }

  /**
   * Resize the PTY (cells).
   * @throws EnvdError `internal` when the process has no PTY (the code E2B's envd uses).
   */
  resize(cols: number, rows: number): void {
    if (!this.relay) throw new EnvdError("internal", `error resizing tty: process ${this.pid} has no PTY`, { pid: this.pid });
    if (!this.running) throw new EnvdError("not_found", `process with pid ${this.pid} has exited`, { pid: this.pid });
    resizePty(this.relay.master, cols, rows);
  }

  private async broadcast(ev: ProcEvent): Promise<void> {
    let live = 0;
    for (const q of this.subscribers) {
      if (q.closed) this.subscribers.delete(q);
      else {
        q.push(ev);
        live++;
        if (ev.kind === "data") ev.holders++;
      }
    }
    if (live === 0 && ev.kind === "data") this.keepDetached(ev);
    // Back-pressure: the slowest live stream bounds how fast output is read.
    for (const q of this.subscribers) await q.waitForSpace();
  }

  /** Keep a read nobody received for the next stream, dropping the oldest past the bound. */
  private keepDetached(ev: Extract<ProcEvent, { kind: "data" }>): void {
    const cap = this.limits.detachedOutputBytes;
    if (cap <= 0) return;
    // a read larger than the bound: its newest bytes, copied (the read itself goes to the collector)
    const kept = ev.data.byteLength > cap ? { ...ev, data: ev.data.slice(ev.data.byteLength - cap), holders: 1 } : ev;
    if (kept === ev) ev.holders++;
    this.detached.push(kept);
    this.detachedBytes += kept.data.byteLength;
    while (this.detachedBytes > cap) {
      const old = this.detached.shift()!;
      this.detachedBytes -= old.data.byteLength;
      releaseOutput(old);
    }
  }

  /**
   * Next read of `reader`, or "idle" once the process has exited and nothing arrived for
   * `outputDrainMs` (background children may hold the pipe open forever). Time spent waiting
   * for a slow consumer never counts: the timer runs only while a read is pending.
   */
  private readOrIdle(reader: OutputReader): Promise<{ done: true; value?: undefined } | { done: false; value: Uint8Array } | "idle"> {
    return new Promise((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const arm = () => {
        timer = setTimeout(() => resolve("idle"), this.limits.outputDrainMs);
      };
      if (this.exited) arm();
      else this.onExit.add(arm);
      reader.read().then(
        (r) => {
          clearTimeout(timer);
          this.onExit.delete(arm);
          resolve(r);
        },
        (err) => {
          clearTimeout(timer);
          this.onExit.delete(arm);
          reject(err);
        },
      );
    });
  }

  private async pump(stream: ReadableStream<Uint8Array>, name: "stdout" | "stderr" | "pty"): Promise<void> {
    const reader = stream.getReader() as unknown as OutputReader & { cancel(): Promise<void> };
    try {
      for (;;) {
        const r = await this.readOrIdle(reader);
        if (r === "idle" || r.done) break;
        // Whatever one read got (up to the pipe's capacity) is one event here; the wire splits
        // it into protocol-sized messages (wire.ts). Each waits for room in the slowest stream's
        // queue, so a slow consumer stops the reads and the process blocks on its full pipe.
        await this.broadcast({ kind: "data", stream: name, data: r.value, holders: 0 });
      }
    } catch (err) {
      log.debug({ pid: this.pid, stream: name, err: errorMessage(err) }, "output stream ended with error");
    } finally {
      // settled before the caller may close the fd the stream reads
      await reader.cancel().catch(() => {});
    }
  }

  /** Pump a pipe read end, then close it. */
  private async pumpPipe(fd: number, name: "stdout" | "stderr"): Promise<void> {
    try {
      await this.pump(Bun.file(fd).stream(), name);
    } finally {
      closeSync(fd);
    }
  }

  private async run(): Promise<ProcessEnd> {
    const pumps = this.relay
      ? [this.pump(this.relay.reader.stdout, "pty")]
      : [this.pumpPipe(this.pipes!.stdout, "stdout"), this.pumpPipe(this.pipes!.stderr, "stderr")];
    const code = await this.proc.exited;
    this.exited = true;
    for (const arm of this.onExit) arm();
    this.onExit.clear();
    await Promise.all(pumps);
    const signal = (this.proc.signalCode as string | null) ?? null;
    const end: ProcessEnd = {
      exitCode: signal ? -1 : code,
      exited: !signal,
      status: exitStatusText(signal ? null : code, signal),
    };
    if (signal || code !== 0) end.error = end.status;
    this.endEvent = end;
    this.stdinOpen = false;
    this.releaseRelay();
    for (const q of this.subscribers) {
      q.push({ kind: "end", end });
      q.close();
    }
    this.subscribers.clear();
    log.debug({ pid: this.pid, ...end }, "process ended");
    return end;
  }

  private releaseRelay(): void {
    if (!this.relay) return;
    this.relay.writer.kill("SIGKILL");
    this.relay.reader.kill("SIGKILL");
    try {
      closeSync(this.relay.master);
    } catch {
      /* already closed */
    }
  }
}
