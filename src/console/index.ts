/**
 * The operators' console: the browser app served at `/console/` by every node and by the
 * gateway (site.ts; the bundle is built into the binary, assets.ts), and the terminal bridge
 * (terminal.ts: tickets, a WebSocket joined to a PTY through envd). The listeners (src/api,
 * services/gateway) wire these in; the browser code lives in web/.
 */
export { ConsoleSite, CONSOLE_PREFIX, isConsolePath, type SiteOptions } from "./site.ts";
export { TerminalService, TERMINAL_PATH_RE, withTerminals, type EnvdLookup, type TerminalOptions, type TerminalWsData } from "./terminal.ts";
export { TicketBook } from "./tickets.ts";
export { EnvdPty, DEFAULT_SHELL, type EnvdTarget, type PtyEvent, type PtySpec } from "./envd-pty.ts";
export { CLOSE, parseServerMessage, terminalPath, type AuthMessage, type ExitMessage, type ReadyMessage, type ResizeMessage, type ServerMessage, type TicketBody } from "./protocol.ts";
export { LogCursor, type LogEntryBody } from "./log-cursor.ts";
export { ConsoleError, CONSOLE_ERRORS, type ConsoleErrorCode } from "./errors.ts";
