/**
 * Start and stop the serving child of one disk (`agentenv disk serve`), from the node.
 */
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { logger } from "../../observability/log.ts";
import type { DiskConfig } from "./config.ts";
import { DiskError } from "./errors.ts";
import { removeRecord } from "./record.ts";
import type { DiskImageSpec, ServeSpec } from "./spec.ts";

const log = logger("disk");

/** A disk being served as a file. */
export interface ExportedDisk {
  id: string;
  /** The file a VMM opens (raw format), inside the FUSE mount. */
  path: string;
  /** pid of the serving child. */
  pid: number;
  /** Resolves with the child's exit code when it exits (null when killed by a signal). */
  exited: Promise<number | null>;
  /** SIGTERM the child (SIGKILL after `stopTimeoutMs`), unmount, remove its record. Idempotent. */
  close(): Promise<void>;
}

/** Command prefix that runs this program's CLI (bun + main.ts from source, or the compiled binary). */
export function agentenvCommand(): string[] {
  const exe = process.execPath;
  if (/(^|\/)bun[^/]*$/.test(exe)) return [exe, fileURLToPath(new URL("../../cli/main.ts", import.meta.url))];
  return [exe];
}

function tail(path: string, bytes = 2000): string {
  try {
    const t = readFileSync(path, "utf8");
    return t.slice(-bytes);
  } catch {
    return "";
  }
}

/**
 * Serve `image` as `<workDir>/mnt/<fileName>` from a new child process.
 * Files in `workDir`: `disk-<id>.json` (spec), `disk-<id>.log` (child's stderr), `mnt/` (mount).
 * @param opts.recordDir where the child's pid record goes (`<runtime_path>/disks`)
 * @throws DiskError `disk.serve_failed` when the child exits early or is not ready in time
 */
export async function exportDisk(opts: {
  id: string;
  image: DiskImageSpec;
  workDir: string;
  recordDir: string;
  fileName?: string;
  config: DiskConfig;
}): Promise<ExportedDisk> {
  const { id, workDir, config } = opts;
  mkdirSync(workDir, { recursive: true });
  const spec: ServeSpec = {
    id,
    image: opts.image,
    mountPoint: join(workDir, "mnt"),
    fileName: opts.fileName ?? "disk.img",
    recordDir: opts.recordDir,
    tuning: {
      workers: config.fuseWorkers,
      maxWrite: config.fuseMaxWrite,
      directIo: config.fuseDirectIo,
      requestTimeoutSec: config.fuseRequestTimeoutSec,
    },
  };
  const specPath = join(workDir, `disk-${id}.json`);
  const logPath = join(workDir, `disk-${id}.log`);
  writeFileSync(specPath, JSON.stringify(spec, null, 2));
  const logFd = openSync(logPath, "a");
  let proc: ReturnType<typeof Bun.spawn>;
  try {
    proc = Bun.spawn([...agentenvCommand(), "disk", "serve", "--spec", specPath], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: logFd,
      env: { ...process.env, AENV_LOG_LEVEL: process.env.AENV_LOG_LEVEL ?? "info" },
    });
  } finally {
    closeSync(logFd);
  }
  const exited = proc.exited.then(() => proc.exitCode);
  const fail = async (why: string): Promise<never> => {
    proc.kill("SIGKILL");
    await exited;
    throw new DiskError("disk.serve_failed", `disk ${id}: serving child ${why}`, { id, specPath, exitCode: proc.exitCode, stderr: tail(logPath) });
  };

  // Wait for the `ready <path>` line, the child's exit, or the timeout.
  const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
  let line = "";
  let timer: Timer | undefined;
  const timeout = new Promise<"timeout">((r) => (timer = setTimeout(() => r("timeout"), config.readyTimeoutMs)));
  try {
    for (;;) {
      const r = await Promise.race([reader.read(), timeout]);
      if (r === "timeout") return await fail(`not ready after ${config.readyTimeoutMs} ms`);
      if (r.done) return await fail("exited before it was ready");
      line += new TextDecoder().decode(r.value);
      if (line.includes("\n")) break;
    }
  } finally {
    clearTimeout(timer);
    reader.releaseLock();
  }
  const m = /^ready (.+)$/m.exec(line);
  if (!m) return await fail(`sent an unexpected line ${JSON.stringify(line)}`);
  const path = m[1]!;
  log.debug({ id, path, pid: proc.pid }, "disk exported");

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGTERM");
        const t = setTimeout(() => proc.kill("SIGKILL"), config.stopTimeoutMs);
        await exited;
        clearTimeout(t);
      }
      // A child killed hard leaves its mount behind: detach it.
      const { umount2, MNT_DETACH } = await import("../../ffi/mount.ts");
      umount2(spec.mountPoint, MNT_DETACH);
      removeRecord(opts.recordDir, id);
    })());
  return { id, path, pid: proc.pid, exited, close };
}

