/**
 * The terminal's WebSocket protocol, shared by the node's bridge (terminal.ts), the browser
 * console (web/terminal.tsx) and `agentenv sandbox connect` (src/cli). Plain types and constants
 * only: this file is bundled into the browser too.
 *
 * 1. `POST /sandboxes/{id}/terminal` with the API key answers 201 `TicketBody`: a one-use ticket
 *    for that sandbox, valid `[console] ticket_ttl_ms`.
 * 2. `GET /sandboxes/{id}/terminal` upgraded to a WebSocket (no key: browsers cannot send
 *    headers on a WebSocket, and no secret goes into a URL). The first frame is a text frame
 *    `AuthMessage` carrying the ticket and the terminal's size.
 * 3. Then client -> node: binary frames are keyboard input (bytes for the PTY), text frames are
 *    `ResizeMessage`s. Node -> client: binary frames are PTY output, text frames are
 *    `ReadyMessage` (once), `ExitMessage` (once, then the node closes with 1000).
 * Refusals close the socket with a `CLOSE` code and a reason.
 */

/** Body of the ticket answer. */
export interface TicketBody {
  ticket: string;
  /** Unix ms after which the ticket is refused. */
  expiresAt: number;
}

/** First frame from the client. `cmd`/`args` default to an interactive login bash. */
export interface AuthMessage {
  type: "auth";
  ticket: string;
  cols: number;
  rows: number;
  /** Guest user the shell runs as (default `user`). */
  user?: string;
  cmd?: string;
  args?: string[];
  cwd?: string;
}

/** The terminal's size changed (character cells). */
export interface ResizeMessage {
  type: "resize";
  cols: number;
  rows: number;
}

/** The PTY process started in the guest. */
export interface ReadyMessage {
  type: "ready";
  pid: number;
}

/** The PTY process ended; `exitCode` is its exit status (-1 when envd reported none). */
export interface ExitMessage {
  type: "exit";
  exitCode: number;
  status: string;
}

export type ClientMessage = AuthMessage | ResizeMessage;
export type ServerMessage = ReadyMessage | ExitMessage;

/**
 * A text frame from the node as a ServerMessage, or null when it is not one (not JSON, another
 * type, a field of the wrong type): read by the CLI and by the browser, so checked by hand here
 * rather than with a schema library the browser bundle would carry.
 */
export function parseServerMessage(text: string): ServerMessage | null {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof v !== "object" || v === null) return null;
  const m = v as Record<string, unknown>;
  if (m.type === "ready" && typeof m.pid === "number") return { type: "ready", pid: m.pid };
  if (m.type === "exit" && typeof m.exitCode === "number") return { type: "exit", exitCode: m.exitCode, status: typeof m.status === "string" ? m.status : "" };
  return null;
}

/** Close codes of the terminal socket (4000-4999: application codes, RFC 6455 §7.4.2). */
export const CLOSE = {
  /** The shell exited (an ExitMessage came first). */
  normal: 1000,
  /** Ticket missing, unknown, used or expired, or for another sandbox. */
  badTicket: 4401,
  /** No auth frame within the bound. */
  authTimeout: 4408,
  /** A frame the protocol does not allow (bad JSON, input before auth). */
  protocol: 4400,
  /** The sandbox is not running, or went away. */
  sandboxGone: 4404,
  /** Too many terminals on the node. */
  busy: 4429,
  /** envd refused the process or its stream broke. */
  envdFailed: 4502,
} as const;

/** Terminal size bounds (character cells) the bridge accepts. */
export const MAX_COLS = 1000;
export const MAX_ROWS = 1000;

/** The terminal path of sandbox `id`. */
export function terminalPath(id: string): string {
  return `/sandboxes/${encodeURIComponent(id)}/terminal`;
}
