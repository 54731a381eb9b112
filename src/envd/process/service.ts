/**
 * `process.Process` Connect service (docs/e2b-contract.md §4.2) on top of ProcessManager.
 * Handlers validate the request, resolve user/cwd/env, and turn process events into
 * ProcessEvent messages with keepalives.
 */
import { statSync } from "node:fs";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { rpcUser } from "../auth.ts";
import { EnvdError, toConnectError } from "../errors.ts";
import { Process, Signal, type ProcessSelector, type ProcessEventSchema } from "../gen/process_pb.ts";
import { resolveCwd } from "../paths.ts";
import type { EnvdState } from "../state.ts";
import type { UserInfo } from "../users.ts";
import type { ProcEvent, ProcessHandle } from "./handle.ts";
import type { ProcessManager, Selector } from "./manager.ts";

/** Settings the service needs besides the manager. */
export interface ProcessServiceOptions {
  /** Keepalive interval when the client sends no `Keepalive-Ping-Interval` header, seconds. */
  defaultKeepaliveS: number;
  /** PTY size when the request gives none (cells). */
  defaultPty: { cols: number; rows: number };
  /** PATH for children (E2B passes envd's own). */
  path: string;
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

function toProto(ev: ProcEvent): MessageInitShape<typeof ProcessEventSchema> {
  switch (ev.kind) {
    case "start":
      return { event: { case: "start" as const, value: { pid: ev.pid } } };
    case "data":
      return { event: { case: "data", value: { output: { case: ev.stream as "stdout", value: ev.data } } } };
    case "end":
      return { event: { case: "end" as const, value: { ...ev.end } } };
    case "keepalive":
      return { event: { case: "keepalive" as const, value: {} } };
  }
}

/** Build the child environment: PATH, the user's identity, sandbox vars, then request envs. */
function childEnv(user: UserInfo, state: EnvdState, req: Record<string, string>, path: string): Record<string, string> {
  return { PATH: path, HOME: user.home, USER: user.name, LOGNAME: user.name, ...state.envVars, ...req };
}

/** Events of `h` as StartResponse/ConnectResponse bodies (both are `{event: ProcessEvent}`). */
async function* streamEvents(h: ProcessHandle, signal: AbortSignal, kaMs: number): AsyncGenerator<{ event: MessageInitShape<typeof ProcessEventSchema> }> {
  const q = h.subscribe();
  try {
    for await (const ev of q.iterate(signal, kaMs, () => ({ kind: "keepalive" }) as const)) yield { event: toProto(ev) };
  } finally {
    h.unsubscribe(q);
  }
}

/** Implementation of `process.Process` for `router.service(Process, ...)`. */
export function processService(manager: ProcessManager, state: EnvdState, opts: ProcessServiceOptions): ServiceImpl<typeof Process> {
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

    async *start(req, ctx) {
      let h: ProcessHandle;
      try {
        const user = rpcUser(state, ctx.requestHeader);
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
        const size = req.pty?.size;
        h = manager.start({
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
      } catch (err) {
        throw toConnectError(err);
      }
      // Connect-Timeout-Ms bounds the process lifetime, not only this stream (E2B semantics).
      const limit = ctx.timeoutMs();
      let timer: ReturnType<typeof setTimeout> | undefined;
      if (limit !== undefined && limit > 0) {
        timer = setTimeout(() => h.signal(9), limit);
        void h.done.then(() => clearTimeout(timer));
      }
      yield* streamEvents(h, ctx.signal, keepaliveMs(ctx.requestHeader, opts.defaultKeepaliveS));
    },

    async *connect(req, ctx) {
      let h: ProcessHandle;
      try {
        h = manager.get(selector(req.process));
      } catch (err) {
        throw toConnectError(err);
      }
      yield* streamEvents(h, ctx.signal, keepaliveMs(ctx.requestHeader, opts.defaultKeepaliveS));
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
        h.signal(req.signal);
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
