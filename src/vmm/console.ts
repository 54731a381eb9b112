/**
 * Bounded guest console log: the VMM's serial output (a pipe) appended to `<workDir>/console.log`;
 * when the file would pass `maxBytes` it is renamed to `console.log.1` (replacing the previous
 * one) and a new file starts, so a chatty guest never uses more than 2 × maxBytes of disk.
 */
import { closeSync, openSync, renameSync, rmSync, writeSync } from "node:fs";

/** Append-only writer with one rotation. Close it when the VMM exits. */
export class ConsoleLog {
  private fd: number;
  private size = 0;

  /** @param path log file (truncated on open) @param maxBytes rotation threshold in bytes (≥ 4096) */
  constructor(
    readonly path: string,
    readonly maxBytes: number,
  ) {
    rmSync(`${path}.1`, { force: true });
    this.fd = openSync(path, "w");
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
  }

  /** Close the file (idempotent). */
  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}
