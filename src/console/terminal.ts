/**
 * The node's terminal bridge: a browser's (or `agentenv sandbox connect`'s) WebSocket joined to
 * a PTY process in the sandbox through envd (envd-pty.ts). Protocol: protocol.ts. The listener
 * calls `mintTicket` for the authenticated `POST /sandboxes/{id}/terminal`, `upgrade` for the
 * WebSocket of `GET /sandboxes/{id}/terminal` (no key: its first frame must redeem a ticket), and
 * routes the sockets it upgraded to `handlers` (see `withTerminals`).
 * Bounds: `maxTerminals` bridged at once, the auth frame within `authTimeoutMs`, and at most
 * `bufferBytes` of output queued on a slow client before the bridge stops reading envd (it
 * reads on when the socket drains).
 */
import type { Server, ServerWebSocket, WebSocketHandler } from "bun";
import { logger } from "../observability/log.ts";
import { errorMessage } from "../util/error.ts";
import { DEFAULT_SHELL, EnvdPty, type EnvdTarget } from "./envd-pty.ts";
import { ConsoleError } from "./errors.ts";
import { CLOSE, MAX_COLS, MAX_ROWS, type AuthMessage, type ExitMessage, type ReadyMessage, type TicketBody } from "./protocol.ts";
import { TicketBook } from "./tickets.ts";

/** `/sandboxes/{id}/terminal`; group 1 is the id (percent-encoded). */
export const TERMINAL_PATH_RE = /^\/sandboxes\/([^/]+)\/terminal$/;

/** How the bridge finds a sandbox's envd: its target, or why there is none. */
export type EnvdLookup = (sandboxId: string) => EnvdTarget | { missing: "not_found" } | { missing: "not_running"; state: string };

/** Bounds of the bridge (config `[console]`). */
export interface TerminalOptions {
  ticketTtlMs: number;
  maxTerminals: number;
  authTimeoutMs: number;
  bufferBytes: number;
}

/** Data of a terminal socket (`ws.data`). */
export interface TerminalWsData {
  terminal: TerminalSocket;
}

interface TerminalSocket {
  sandboxId: string;
  /** Waiting for the auth frame, starting the process, or bridging it. */
  phase: "auth" | "starting" | "open";
  pty?: EnvdPty;
  /** Input and the last resize that came while the process was starting. */
  early: Uint8Array[];
  earlyBytes: number;
  earlySize?: { cols: number; rows: number };
  authTimer?: ReturnType<typeof setTimeout>;
  /** Resolved when the socket drains below the buffer bound. */
  drained?: () => void;
  closed: boolean;
}

const log = logger("console");
/** Input a client may send between its auth frame and the shell's start, bytes. */
const EARLY_INPUT_MAX_BYTES = 65_536;

function decodeId(raw: string): string | null {
  try {
    return decodeURIComponent(raw);
  } catch {
    return null;
  }
}

const size = (n: unknown, max: number) => typeof n === "number" && Number.isInteger(n) && n >= 1 && n <= max;

/** Terminal tickets and sockets of one node listener. */
export class TerminalService {
  readonly tickets: TicketBook;
  private readonly open = new Set<ServerWebSocket<TerminalWsData>>();

  constructor(
    private readonly o: TerminalOptions,
    private readonly envd: EnvdLookup,
  ) {
    this.tickets = new TicketBook(o.ticketTtlMs);
  }

  /** Terminals bridged now. */
  get active(): number {
    return this.open.size;
  }

  /**
   * Mint a ticket for sandbox `id` (the caller checked the API key).
   * @throws ConsoleError `console.sandbox_not_found` (404), `console.sandbox_not_running` (409),
   *   `console.too_many_terminals` (429).
   */
  mintTicket(id: string): TicketBody {
    const t = this.envd(id);
    if ("missing" in t) {
      if (t.missing === "not_found") throw new ConsoleError("console.sandbox_not_found", `sandbox ${id} not found`, { sandboxId: id });
      throw new ConsoleError("console.sandbox_not_running", `sandbox ${id} is ${t.state}: a terminal needs it running (resume it first)`, { sandboxId: id, state: t.state });
    }
    if (this.open.size >= this.o.maxTerminals) throw new ConsoleError("console.too_many_terminals", `this node bridges ${this.o.maxTerminals} terminals already ([console] max_terminals)`, { limit: this.o.maxTerminals });
    return this.tickets.mint(id);
  }

  /**
   * `POST /sandboxes/{id}/terminal` (API key already checked): 201 with a ticket.
   * @returns null when `req` is not that request.
   * @throws ConsoleError as mintTicket.
   */
  handleTicket(req: Request, url: URL): Response | null {
    const m = TERMINAL_PATH_RE.exec(url.pathname);
    if (!m || req.method !== "POST") return null;
    const id = decodeId(m[1]!);
    if (id === null) throw new ConsoleError("console.bad_request", "malformed sandbox id in the path", { field: "sandboxID" });
    return Response.json(this.mintTicket(id), { status: 201, headers: { "cache-control": "no-store" } });
  }

  /**
   * Upgrade `GET /sandboxes/{id}/terminal` to a terminal socket.
   * @returns null when `req` is not a terminal upgrade, "upgraded", or a Response when refused.
   */
  upgrade(req: Request, url: URL, server: Server<TerminalWsData> | Server<any>): Response | "upgraded" | null {
    const m = TERMINAL_PATH_RE.exec(url.pathname);
    if (!m || req.headers.get("upgrade")?.toLowerCase() !== "websocket") return null;
    const id = decodeId(m[1]!);
    if (id === null) return Response.json({ code: 400, message: "malformed sandbox id in the path" }, { status: 400 });
    const data: TerminalWsData = { terminal: { sandboxId: id, phase: "auth", early: [], earlyBytes: 0, closed: false } };
    return (server as Server<TerminalWsData>).upgrade(req, { data }) ? "upgraded" : Response.json({ code: 400, message: "WebSocket upgrade failed" }, { status: 400 });
  }

  /** WebSocket handlers of terminal sockets. */
  readonly handlers: Required<Pick<WebSocketHandler<TerminalWsData>, "open" | "message" | "drain" | "close">> = {
    open: (ws) => {
      ws.data.terminal.authTimer = setTimeout(() => ws.close(CLOSE.authTimeout, `no auth frame within ${this.o.authTimeoutMs} ms`), this.o.authTimeoutMs);
    },
    message: (ws, m) => {
      const t = ws.data.terminal;
      if (t.phase === "auth") {
        if (typeof m !== "string") return ws.close(CLOSE.protocol, "the first frame must be the auth message");
        clearTimeout(t.authTimer);
        t.phase = "starting";
        void this.authenticate(ws, m);
        return;
      }
      if (typeof m !== "string") {
        const bytes = new Uint8Array(m);
        if (t.pty) return t.pty.input(bytes);
        t.earlyBytes += bytes.length;
        if (t.earlyBytes > EARLY_INPUT_MAX_BYTES) return ws.close(CLOSE.protocol, `more than ${EARLY_INPUT_MAX_BYTES} bytes of input before the shell started`);
        t.early.push(bytes);
        return;
      }
      let msg: { type?: string; cols?: unknown; rows?: unknown };
      try {
        msg = JSON.parse(m);
      } catch {
        return ws.close(CLOSE.protocol, "text frames must be JSON");
      }
      if (msg.type !== "resize" || !size(msg.cols, MAX_COLS) || !size(msg.rows, MAX_ROWS)) return ws.close(CLOSE.protocol, "expected {type: resize, cols, rows}");
      const s = { cols: msg.cols as number, rows: msg.rows as number };
      if (!t.pty) return void (t.earlySize = s);
      t.pty.resize(s.cols, s.rows).catch((e) => log.debug({ sandboxId: t.sandboxId, err: errorMessage(e) }, "terminal resize failed"));
    },
    drain: (ws) => {
      const d = ws.data.terminal.drained;
      ws.data.terminal.drained = undefined;
      d?.();
    },
    close: (ws) => {
      const t = ws.data.terminal;
      t.closed = true;
      clearTimeout(t.authTimer);
      this.open.delete(ws);
      t.drained?.();
      void t.pty?.close();
    },
  };

  private async authenticate(ws: ServerWebSocket<TerminalWsData>, text: string): Promise<void> {
    const t = ws.data.terminal;
    let a: Partial<AuthMessage>;
    try {
      a = JSON.parse(text);
    } catch {
      return ws.close(CLOSE.protocol, "the auth frame must be JSON");
    }
    if (a.type !== "auth" || !this.tickets.redeem(a.ticket, t.sandboxId)) return ws.close(CLOSE.badTicket, "ticket missing, expired, used or for another sandbox");
    if (!size(a.cols, MAX_COLS) || !size(a.rows, MAX_ROWS)) return ws.close(CLOSE.protocol, `cols and rows must be integers in 1..${MAX_COLS}`);
    if (this.open.size >= this.o.maxTerminals) return ws.close(CLOSE.busy, `this node bridges ${this.o.maxTerminals} terminals already`);
    const target = this.envd(t.sandboxId);
    if ("missing" in target) return ws.close(CLOSE.sandboxGone, target.missing === "not_found" ? "sandbox not found" : `sandbox is ${target.state}`);
    const strings = (v: unknown) => Array.isArray(v) && v.every((s) => typeof s === "string");
    if ((a.cmd !== undefined && typeof a.cmd !== "string") || (a.args !== undefined && !strings(a.args)) || (a.user !== undefined && typeof a.user !== "string") || (a.cwd !== undefined && typeof a.cwd !== "string")) {
      return ws.close(CLOSE.protocol, "cmd, user and cwd must be strings, args a list of strings");
    }
    this.open.add(ws);
    let pty: EnvdPty;
    try {
      pty = await EnvdPty.start(t.sandboxId, target, {
        cols: a.cols as number,
        rows: a.rows as number,
        user: a.user || "user",
        cmd: a.cmd || DEFAULT_SHELL.cmd,
        args: a.cmd ? (a.args ?? []) : [...DEFAULT_SHELL.args],
        cwd: a.cwd,
        envs: { ...DEFAULT_SHELL.envs },
      });
    } catch (e) {
      this.open.delete(ws);
      log.warn({ sandboxId: t.sandboxId, err: errorMessage(e) }, "terminal process did not start");
      return ws.close(CLOSE.envdFailed, errorMessage(e).slice(0, 120));
    }
    if (t.closed) return void pty.close();
    t.pty = pty;
    t.phase = "open";
    ws.send(JSON.stringify({ type: "ready", pid: pty.pid } satisfies ReadyMessage));
    if (t.earlySize) pty.resize(t.earlySize.cols, t.earlySize.rows).catch(() => {});
    for (const b of t.early) pty.input(b);
    t.early = [];
    log.info({ sandboxId: t.sandboxId, pid: pty.pid }, "terminal opened");
    await this.pump(ws, pty);
  }

  /** envd's output to the socket until the process ends or the socket closes. */
  private async pump(ws: ServerWebSocket<TerminalWsData>, pty: EnvdPty): Promise<void> {
    const t = ws.data.terminal;
    try {
      for await (const ev of pty.events()) {
        if (t.closed) return;
        if (ev.kind === "data") {
          ws.send(ev.bytes);
          if (ws.getBufferedAmount() > this.o.bufferBytes) await new Promise<void>((r) => (t.drained = r));
          continue;
        }
        ws.send(JSON.stringify({ type: "exit", exitCode: ev.exitCode, status: ev.status } satisfies ExitMessage));
        log.info({ sandboxId: t.sandboxId, pid: pty.pid, exitCode: ev.exitCode }, "terminal closed: the process exited");
        return ws.close(CLOSE.normal, "exited");
      }
      if (!t.closed) ws.close(CLOSE.sandboxGone, "the process stream ended without an exit (the sandbox went away)");
    } catch (e) {
      if (!t.closed) ws.close(CLOSE.envdFailed, errorMessage(e).slice(0, 120));
    }
  }
}

/**
 * One set of WebSocket handlers for a listener that upgrades both its own sockets (`inner`,
 * e.g. the sandbox proxy's relay) and terminal sockets (their `data` has `terminal`).
 */
export function withTerminals<T extends object>(inner: WebSocketHandler<T>, terminals: TerminalService): WebSocketHandler<T | TerminalWsData> {
  const isTerminal = (ws: ServerWebSocket<T | TerminalWsData>): ws is ServerWebSocket<TerminalWsData> => "terminal" in (ws.data as object);
  const h = terminals.handlers;
  return {
    open: (ws) => (isTerminal(ws) ? h.open(ws) : inner.open?.(ws as ServerWebSocket<T>)),
    message: (ws, m) => (isTerminal(ws) ? h.message(ws, m) : inner.message?.(ws as ServerWebSocket<T>, m)),
    drain: (ws) => (isTerminal(ws) ? h.drain(ws) : inner.drain?.(ws as ServerWebSocket<T>)),
    close: (ws, code, reason) => (isTerminal(ws) ? h.close(ws, code, reason) : inner.close?.(ws as ServerWebSocket<T>, code, reason)),
  };
}
