/**
 * Pseudo-terminals through libc via bun:ffi: `openpty(3)` to allocate a master/slave pair and
 * `ioctl(TIOCSWINSZ)` to resize. Bun has no PTY API; these two calls are all envd needs (the
 * child gets the slave as stdio and `setsid -c` makes it the controlling terminal).
 * Sources: openpty(3) (in libc.so.6 since glibc 2.34, libutil.so.1 before), ioctl_tty(2),
 * `struct winsize` in include/uapi/asm-generic/termios.h.
 */
import { ptr } from "bun:ffi";
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc, openptyFn } from "./libc.ts";

/** Thrown when a PTY cannot be allocated or resized; `details.errno` holds the C errno. */
export class PtyError extends AgentEnvError<FfiCodes<"pty">> {}

// include/uapi/asm-generic/ioctls.h
const TIOCSWINSZ = 0x5414;
// struct winsize { unsigned short ws_row, ws_col, ws_xpixel, ws_ypixel; } = 8 bytes
export const WINSIZE_SIZE = 8;
const WS_ROW = 0;
const WS_COL = 2;

/** Encode a `struct winsize` (rows, cols in character cells; pixels left 0). */
export function encodeWinsize(cols: number, rows: number): Uint8Array {
  const buf = new Uint8Array(WINSIZE_SIZE);
  const view = new DataView(buf.buffer);
  view.setUint16(WS_ROW, rows, true);
  view.setUint16(WS_COL, cols, true);
  return buf;
}

/** A master/slave fd pair; the caller owns both and closes them with `fs.closeSync`. */
export interface PtyPair {
  master: number;
  slave: number;
}

/**
 * Allocate a PTY of `cols` x `rows` character cells.
 * @throws PtyError `pty.open_failed` with errno.
 */
export function openPty(cols: number, rows: number): PtyPair {
  const fds = new Int32Array(2);
  const ws = encodeWinsize(cols, rows);
  const rc = openptyFn()(ptr(fds), ptr(fds, 4), null, null, ptr(ws));
  if (rc !== 0) throw new PtyError("pty.open_failed", "openpty failed", { errno: errno(), cols, rows });
  return { master: fds[0]!, slave: fds[1]! };
}

/**
 * Set the window size of the terminal behind `fd` (master or slave); the kernel then sends
 * SIGWINCH to the terminal's foreground process group.
 * @throws PtyError `pty.resize_failed` with errno.
 */
export function resizePty(fd: number, cols: number, rows: number): void {
  const ws = encodeWinsize(cols, rows);
  const rc = libc().ioctl(fd, TIOCSWINSZ, ptr(ws));
  if (rc !== 0) throw new PtyError("pty.resize_failed", "ioctl(TIOCSWINSZ) failed", { errno: errno(), fd, cols, rows });
}
