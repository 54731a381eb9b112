/**
 * `process.Process` Connect service (docs/e2b-contract.md §4.2) on top of ProcessManager.
 * Handlers validate the request, resolve user/cwd/env, and turn process events into
 * ProcessEvent messages with keepalives. The two output streams (Start, Connect) bypass the
 * Connect router (`processStreams`): their events are batched into one body chunk and pulled.
 */
import { statSync } from "node:fs";
import type { ServiceImpl } from "@connectrpc/connect";
import { rpcUser } from "../auth.ts";
import { freedOnRelease } from "../buffers.ts";
import { serveServerStream, type StreamBody, type StreamLimits } from "../connect-stream.ts";
import { EnvdError, toConnectError } from "../errors.ts";
import { ConnectRequestSchema, Process, Signal, StartRequestSchema, type ProcessSelector, type StartRequest } from "../gen/process_pb.ts";
import { resolveCwd } from "../paths.ts";
import { requireAccess, X_OK } from "../permissions.ts";
import type { EnvdState } from "../state.ts";
import type { UserInfo } from "../users.ts";
import { releaseOutput, type ProcEvent, type ProcessHandle } from "./handle.ts";
import type { ProcessManager, Selector } from "./manager.ts";
import { encodeEvents, partsBytes } from "./wire.ts";

/** Settings the service needs besides the manager. */
export interface ProcessServiceOptions {
  /** Keepalive interval when the client sends no `Keepalive-Ping-Interval` header, seconds. */
  defaultKeepaliveS: number;
  /** PTY size when the request gives none (cells). */
  defaultPty: { cols: number; rows: number };
  /** PATH for children (E2B passes envd's own). */
  path: string;
  /** Most output bytes taken from a stream's queue for one batch (whole reads; at least one). */
  batchBytes: number;
  /** Largest output payload of one data message on the wire, bytes (a read is split into these). */
  maxEventBytes: number;
  /**
   * Bytes of encoded output (all streams together) after which envd collects garbage
   * synchronously; 0 = leave it to the runtime. Bulk output allocates a read buffer, a base64
   * string and a body chunk per batch; without this, RSS climbs tens of MiB before the
   * runtime's own collector catches up.
   */
  gcEveryBytes: number;
  /** Request-side limits of the output streams. */
  stream: StreamLimits;
}

/** The keepalive interval a streaming request asks for, ms. */
export function keepaliveMs(headers: Headers, defaultS: number): number {
  const v = Number(headers.get("keepalive-ping-interval"));
  return (Number.isFinite(v) && v > 0 ? v : defaultS) * 1000;
}

function selector(sel: ProcessSelector | undefined): Selector {
  switch (sel?.selector.case) {
    case "pid":
      return { pid: sel.selector.value };
    case "tag":
      return { tag: sel.selector.value };
    default:
      // E2B's envd answers a request without pid or tag with `unimplemented`
      throw new EnvdError("unimplemented", "process selector (pid or tag) is required", {});
  }
}

/** Build the child environment: PATH, the user's identity, trust-store vars, sandbox vars, then request envs. */
function childEnv(user: UserInfo, state: EnvdState, req: Record<string, string>, path: string): Record<string, string> {
  return { PATH: path, HOME: user.home, USER: user.name, LOGNAME: user.name, ...state.trustEnv, ...state.envVars, ...req };
}

/**
 * Runs a synchronous garbage collection after every `everyBytes` of short-lived buffers the
 * output path left behind (0 = never): JSON's base64 text and the envelope buffers. The reads
 * themselves, sent as binary payloads, are not counted: they are freed once every stream sent
 * them (`releaseOutput`).
 */
class GcPacer {
  private sent = 0;

  constructor(private readonly everyBytes: number) {}

  count(bytes: number): void {
    if (this.everyBytes <= 0) return;
    this.sent += bytes;
    if (this.sent < this.everyBytes) return;
    this.sent = 0;
    Bun.gc(true);
  }
}

/**
 * The output stream of `h` for one client: start, data (the reads queued, up to `batchBytes` of
 * them per batch, in messages of at most `maxEventBytes`), keepalives when idle for `kaMs`, end. Its queue is bounded
 * (`HandleLimits`), so a client that reads slowly holds the process back.
 */
function eventStream(h: ProcessHandle, binary: boolean, kaMs: number, opts: ProcessServiceOptions, gc: GcPacer): StreamBody {
  const q = h.subscribe();
  /** The batch last returned: `next` is asked again only once that batch was written. */
  let sent: ProcEvent[] = [];
  return {
    async next(signal) {
      for (const ev of sent) releaseOutput(ev);
      sent = [];
      const r = await q.ready(signal, kaMs);
      if (r === "idle") return encodeEvents([{ kind: "keepalive" }], binary, opts.maxEventBytes);
      if (r !== "items") return null;
      sent = q.take(opts.batchBytes);
      const parts = encodeEvents(sent, binary, opts.maxEventBytes);
      let freed = 0;
      if (binary) for (const ev of sent) if (ev.kind === "data" && freedOnRelease(ev.data)) freed += ev.data.byteLength;
      gc.count(partsBytes(parts) - freed);
      return parts;
    },
    close: () => {
      h.unsubscribe(q);
      // what was queued but never taken was never written: done with it (the batch last
      // returned may still be under a write, and is left to the collector)
      for (const ev of q.take(Infinity)) releaseOutput(ev);
    },
  };
}

/**
 * The process starts in `cwd` as `user`, so `user` needs search (x) permission on it and on every
 * directory above it, as chdir(2) after the identity switch checks (E2B's envd: Go's exec changes
 * directory after dropping to the user, so its start fails there). Root passes.
 * @throws EnvdError `permission_denied` naming the first directory the user cannot enter
 */
function requireSearchable(user: UserInfo, cwd: string): void {
  if (user.uid === 0) return;
  const parts = cwd.split("/").filter(Boolean);
  for (let i = 0; i <= parts.length; i++) requireAccess(user, "/" + parts.slice(0, i).join("/"), X_OK, `start in cwd '${cwd}'`);
}

/**
 * Validate a StartRequest, resolve user, cwd and environment, and spawn the process. A
 * `connect-timeout-ms` bounds the process lifetime, not only the stream (E2B semantics).
 * @throws EnvdError `invalid_argument` (no cmd, missing cwd, not executable), `unauthenticated`
 *   (unknown user), `permission_denied` (a cwd the user cannot enter), `resource_exhausted` (too many
 *   processes).
 */
function startProcess(manager: ProcessManager, state: EnvdState, opts: ProcessServiceOptions, req: StartRequest, header: Headers, timeoutMs: number | undefined): ProcessHandle {
  const user = rpcUser(state, header);
  const cfg = req.process;
  if (!cfg || !cfg.cmd) throw new EnvdError("invalid_argument", "process.cmd is required", {});
  const cwd = resolveCwd(cfg.cwd, user, state.defaultWorkdir);
  let isDir = false;
  try {
    isDir = statSync(cwd).isDirectory();
  } catch {
    /* reported below */
  }
  if (!isDir) throw new EnvdError("invalid_argument", `cwd '${cwd}' does not exist`, { cwd });
  requireSearchable(user, cwd);
  const size = req.pty?.size;
  const h = manager.start({
    cmd: cfg.cmd,
    args: cfg.args,
    env: childEnv(user, state, cfg.envs, opts.path),
    requestEnvs: { ...cfg.envs },
    cwd,
    requestCwd: cfg.cwd,
    user,
    tag: req.tag,
    stdin: req.stdin ?? true,
    pty: req.pty ? { cols: size?.cols || opts.defaultPty.cols, rows: size?.rows || opts.defaultPty.rows } : undefined,
  });
  if (timeoutMs !== undefined && timeoutMs > 0) {
    const timer = setTimeout(() => h.signal(9), timeoutMs);
    void h.done.then(() => clearTimeout(timer));
  }
  return h;
}

/**
 * The server-streaming RPCs `process.Process/Start` and `/Connect`, served by
 * `serveServerStream` (batched envelopes, pulled by the client) rather than the Connect router.
 * Keys are request paths.
 */
export function processStreams(manager: ProcessManager, state: EnvdState, opts: ProcessServiceOptions): Map<string, (req: Request) => Promise<Response>> {
  const ka = (header: Headers) => keepaliveMs(header, opts.defaultKeepaliveS);
  const gc = new GcPacer(opts.gcEveryBytes);
  return new Map([
    [
      "/process.Process/Start",
      (req: Request) =>
        serveServerStream(req, StartRequestSchema, opts.stream, (call) => {
          const h = startProcess(manager, state, opts, call.message, call.header, call.timeoutMs);
          return eventStream(h, call.binary, ka(call.header), opts, gc);
        }),
    ],
    [
      "/process.Process/Connect",
      (req: Request) =>
        serveServerStream(req, ConnectRequestSchema, opts.stream, (call) => eventStream(manager.get(selector(call.message.process)), call.binary, ka(call.header), opts, gc)),
    ],
  ]);
}

/** Unary and client-streaming RPCs of `process.Process` for `router.service(Process, ...)` (Start and Connect: `processStreams`). */
export function processService(manager: ProcessManager): Partial<ServiceImpl<typeof Process>> {
  return {
    async list() {
      return {
        processes: manager.list().map((h) => ({
          pid: h.pid,
          tag: h.spec.tag,
          config: { cmd: h.spec.cmd, args: h.spec.args, envs: h.spec.requestEnvs, cwd: h.spec.requestCwd },
        })),
      };
    },

    async update(req) {
      try {
        const h = manager.getRunning(selector(req.process));
        const size = req.pty?.size;
        if (size) {
          if (!size.cols || !size.rows) throw new EnvdError("invalid_argument", "pty size needs cols and rows > 0", { ...size });
          h.resize(size.cols, size.rows);
        }
        return {};
      } catch (err) {
        throw toConnectError(err);
      }
    },

    async sendInput(req) {
      try {
        const h = manager.getRunning(selector(req.process));
        const input = req.input?.input;
        if (!input?.case) throw new EnvdError("unimplemented", "input (stdin or pty) is required", { pid: h.pid });
        await h.write(input.case, input.value);
        return {};
      } catch (err) {
        throw toConnectError(err);
      }
    },

    async streamInput(reqs) {
      try {
        let h: ProcessHandle | undefined;
        for await (const msg of reqs) {
          if (msg.event.case === "start") {
            h = manager.getRunning(selector(msg.event.value.process));
          } else if (msg.event.case === "data") {
            if (!h) throw new EnvdError("invalid_argument", "StreamInput data before start", {});
            const input = msg.event.value.input?.input;
            if (input?.case) await h.write(input.case, input.value);
          }
        }
        return {};
      } catch (err) {
        throw toConnectError(err);
      }
    },

    async sendSignal(req) {
      try {
        const h = manager.getRunning(selector(req.process));
        if (req.signal !== Signal.SIGKILL && req.signal !== Signal.SIGTERM) {
          throw new EnvdError("unimplemented", `signal ${req.signal} is not supported (SIGKILL, SIGTERM only)`, { signal: req.signal });
        }
        await h.kill(req.signal);
        return {};
      } catch (err) {
        throw toConnectError(err);
      }
    },

    async closeStdin(req) {
      try {
        await manager.getRunning(selector(req.process)).closeStdin();
        return {};
      } catch (err) {
        throw toConnectError(err);
      }
    },
  };
}
