/**
 * Files that survive a crash whole: written beside their place, fsynced, renamed over it, and
 * the directory fsynced (rename(2) is atomic, but only the directory's fsync makes the new name
 * durable; the file's fsync first makes sure the name never points at unwritten data). A reader
 * sees the old content or the new, never a part. Every write-then-rename in the code goes
 * through here.
 */
import { closeSync, fsyncSync, openSync, renameSync, rmSync, writeFileSync, constants as fsc } from "node:fs";
import { dirname } from "node:path";
import { errorCode } from "./error.ts";

/**
 * fsync the file or directory at `path` (a file this process may only write, e.g. mode 0200
 * for a non-root owner, is opened for writing instead).
 * @throws the fs error (ENOENT, EIO, ...)
 */
export function fsyncPath(path: string): void {
  let fd: number;
  try {
    fd = openSync(path, fsc.O_RDONLY);
  } catch (e) {
    if (errorCode(e) !== "EACCES") throw e;
    fd = openSync(path, fsc.O_WRONLY);
  }
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** fsync directory `dir`, so a name created, renamed or removed in it is durable. */
export function fsyncDir(dir: string): void {
  fsyncPath(dir);
}

/**
 * Put the finished file `tmp` in place of `path`, durably: fsync `tmp`, rename it over `path`,
 * fsync `path`'s directory. `tmp` must be on the same file system (rename(2), EXDEV otherwise).
 * @throws the fs error; `tmp` is left for the caller to remove
 */
export function renameDurable(tmp: string, path: string): void {
  fsyncPath(tmp);
  renameSync(tmp, path);
  fsyncDir(dirname(path));
}

/** Options of writeFileDurable. */
export interface DurableWriteOptions {
  /** Mode of the file (default 0o666 less the umask). */
  mode?: number;
  /** The temporary file (default `${path}.tmp`); a crash may leave it, for the owner's start-up to remove. */
  tmp?: string;
}

/**
 * Write `data` to `path` atomically and durably: into the temporary file, fsynced, renamed over
 * `path`, the directory fsynced. On failure the temporary file is removed and `path` is as it was.
 * @throws the fs error
 */
export function writeFileDurable(path: string, data: string | Uint8Array, opts: DurableWriteOptions = {}): void {
  const tmp = opts.tmp ?? `${path}.tmp`;
  try {
    writeFileSync(tmp, data, opts.mode === undefined ? undefined : { mode: opts.mode });
    renameDurable(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
}
