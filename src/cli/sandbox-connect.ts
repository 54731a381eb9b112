/**
 * `agentenv sandbox connect ID`: an interactive terminal in a sandbox, through the node's (or
 * gateway's) terminal bridge (src/console/protocol.ts): a ticket from the authenticated
 * `POST /sandboxes/{id}/terminal`, then a WebSocket whose first frame carries it. The local
 * terminal is put in raw mode (keys go to the sandbox as typed, Ctrl-C included), size changes
 * follow SIGWINCH, and the command exits with the remote shell's exit code. Without a terminal
 * on stdin, stdin is sent as it is and its end as Ctrl-D.
 */
import { defineCommand } from "citty";
import { CLOSE, parseServerMessage, terminalPath, type AuthMessage, type ResizeMessage, type TicketBody } from "../console/index.ts";
import { call, CliError, common, conn, run, type Conn } from "./node-client.ts";

/** The size to report: the terminal's, else 80x24. */
function termSize(): { cols: number; rows: number } {
  const [cols, rows] = process.stdout.isTTY ? process.stdout.getWindowSize() : [0, 0];
  return { cols: cols > 0 ? cols : 80, rows: rows > 0 ? rows : 24 };
}

/** `http(s)://host` -> `ws(s)://host`. */
export function wsUrl(httpUrl: string): string {
  return httpUrl.replace(/^http/, "ws");
}

/** Why a terminal socket closed, in words, for codes other than a normal end. */
function closeReason(code: number, reason: string): string {
  const known: Record<number, string> = {
    [CLOSE.badTicket]: "the node refused the ticket",
    [CLOSE.authTimeout]: "the node waited too long for the ticket",
    [CLOSE.sandboxGone]: "the sandbox is not running",
    [CLOSE.busy]: "the node has too many terminals open",
    [CLOSE.envdFailed]: "envd refused the shell",
  };
  return `${known[code] ?? `closed with code ${code}`}${reason ? `: ${reason}` : ""}`;
}

/**
 * Open a terminal in sandbox `id` on the local terminal and run it until the remote shell ends.
 * @returns the shell's exit code.
 * @throws CliError when the ticket is refused or the socket closes without an exit.
 */
export async function connectTerminal(c: Conn, id: string, o: { user?: string; cmd?: string }): Promise<number> {
  const ticket = (await call(c, "POST", terminalPath(id))).data as TicketBody;
  const ws = new WebSocket(wsUrl(c.url) + terminalPath(id));
  ws.binaryType = "arraybuffer";
  const stdin = process.stdin;
  const raw = stdin.isTTY === true;
  let exitCode: number | null = null;
  const sendSize = () => ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ type: "resize", ...termSize() } satisfies ResizeMessage));
  const onData = (b: Buffer) => ws.readyState === WebSocket.OPEN && ws.send(b);
  const onEnd = () => ws.readyState === WebSocket.OPEN && ws.send(new Uint8Array([4]));
  try {
    return await new Promise<number>((resolve, reject) => {
      ws.onopen = () => {
        ws.send(JSON.stringify({ type: "auth", ticket: ticket.ticket, ...termSize(), ...(o.user ? { user: o.user } : {}), ...(o.cmd ? { cmd: "/bin/bash", args: ["-l", "-c", o.cmd] } : {}) } satisfies AuthMessage));
        if (raw) stdin.setRawMode(true);
        stdin.on("data", onData);
        stdin.on("end", onEnd);
        stdin.resume();
        process.on("SIGWINCH", sendSize);
      };
      ws.onmessage = (ev) => {
        if (typeof ev.data !== "string") return void process.stdout.write(new Uint8Array(ev.data as ArrayBuffer));
        const m = parseServerMessage(ev.data);
        if (m?.type === "exit") exitCode = m.exitCode;
      };
      ws.onerror = () => reject(new CliError(`the terminal connection to ${c.url} failed`));
      ws.onclose = (ev) => {
        if (exitCode !== null) resolve(exitCode);
        else reject(new CliError(closeReason(ev.code, ev.reason)));
      };
    });
  } finally {
    process.off("SIGWINCH", sendSize);
    stdin.off("data", onData);
    stdin.off("end", onEnd);
    if (raw) stdin.setRawMode(false);
    stdin.pause();
  }
}

export default defineCommand({
  meta: { name: "connect", description: "an interactive terminal in a sandbox; exits with the shell's exit code" },
  args: {
    ...common,
    id: { type: "positional", required: true, description: "sandbox id" },
    user: { type: "string", description: "guest user (default: user)" },
    cmd: { type: "string", description: "run this command on the terminal instead of a login shell" },
  },
  run: ({ args }) =>
    run(async () => {
      const code = await connectTerminal(conn(args), args.id, { user: args.user, cmd: args.cmd });
      process.exit(code);
    }),
});
