/**
 * Bounded guest console log: the VMM's serial output (a socket or pipe) appended to `<workDir>/console.log`;
 * when the file would pass `maxBytes` it is renamed to `console.log.1` (replacing the previous
 * one) and a new file starts, so a chatty guest never uses more than 2 × maxBytes of disk.
 * Optionally each complete line (without its `\r\n`) is also handed to a listener; a line longer
 * than `MAX_LINE_BYTES` is handed over in pieces of that size.
 */
import { closeSync, fstatSync, openSync, renameSync, rmSync, writeSync } from "node:fs";

/** Longest line handed to a line listener in one piece, bytes. */
export const MAX_LINE_BYTES = 8192;

/** Append-only writer with one rotation. Close it when the VMM exits. */
export class ConsoleLog {
  private fd: number;
  private size = 0;
  private partial: Buffer[] = [];
  private partialBytes = 0;

  /**
   * @param path log file (truncated on open, with its `.1` removed, unless `append`)
   * @param maxBytes rotation threshold in bytes (≥ 4096)
   * @param onLine called with each complete console line (UTF-8 decoded, trailing CR removed); must not throw
   * @param append continue the existing file and its `.1` (a node adopting a running VM's console)
   */
  constructor(
    readonly path: string,
    readonly maxBytes: number,
    private readonly onLine?: (line: string) => void,
    append = false,
  ) {
    if (!append) rmSync(`${path}.1`, { force: true });
    this.fd = openSync(path, append ? "a" : "w");
    if (append) this.size = fstatSync(this.fd).size;
  }

  /** Append `chunk`, rotating first when the file would exceed `maxBytes`. Ignored after close. */
  write(chunk: Uint8Array): void {
    if (this.fd < 0) return;
    if (this.size > 0 && this.size + chunk.length > this.maxBytes) {
      closeSync(this.fd);
      renameSync(this.path, `${this.path}.1`);
      this.fd = openSync(this.path, "w");
      this.size = 0;
    }
    const part = chunk.length > this.maxBytes ? chunk.subarray(chunk.length - this.maxBytes) : chunk;
    writeSync(this.fd, part);
    this.size += part.length;
    if (this.onLine) this.splitLines(chunk);
  }

  /** Close the file (idempotent); a last unterminated line goes to the listener. */
  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
    if (this.partialBytes > 0) this.emit(Buffer.concat(this.partial));
    this.partial = [];
    this.partialBytes = 0;
  }

  private splitLines(chunk: Uint8Array): void {
    let buf = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    for (;;) {
      const nl = buf.indexOf(10);
      if (nl < 0) break;
      this.partial.push(buf.subarray(0, nl));
      this.emit(Buffer.concat(this.partial));
      this.partial = [];
      this.partialBytes = 0;
      buf = buf.subarray(nl + 1);
    }
    if (buf.length === 0) return;
    this.partial.push(Buffer.from(buf)); // copied: the caller may reuse its chunk
    this.partialBytes += buf.length;
    while (this.partialBytes >= MAX_LINE_BYTES) {
      const all = Buffer.concat(this.partial);
      this.emit(all.subarray(0, MAX_LINE_BYTES));
      const rest = all.subarray(MAX_LINE_BYTES);
      this.partial = rest.length ? [rest] : [];
      this.partialBytes = rest.length;
    }
  }

  private emit(line: Buffer): void {
    const text = line.toString("utf8").replace(/\r+$/, "");
    try {
      this.onLine!(text);
    } catch {
      // a listener must not break the console capture
    }
  }
}
