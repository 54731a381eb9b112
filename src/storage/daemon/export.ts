/**
 * Start, supervise and stop the serving child of one disk (`agentenv disk serve`), from the node.
 * The node mounts the FUSE connection and keeps its fd; the child inherits it as fd 3 and serves.
 * A child that dies is replaced (`--resume`) up to `max_restarts` times, without unmounting.
 *
 * Children run in their own session (`detached`: setsid(2) before exec, Bun >= the pinned 1.4.4),
 * so a Ctrl-C on the node's terminal (SIGINT to the whole foreground process group) reaches only
 * the node: the disks keep serving until the node's shutdown closes them in order.
 */
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { MNT_DETACH, umount2 } from "../../ffi/mount.ts";
import { logger } from "../../observability/log.ts";
import { mountFuse } from "../fuse/server.ts";
import type { DiskConfig } from "./config.ts";
import { DiskError } from "./errors.ts";
import { removeRecord } from "./record.ts";
import type { DiskImageSpec, ServeSpec } from "./spec.ts";

const log = logger("disk");
/** fd number the child finds the FUSE connection on (stdin, stdout, stderr, then this). */
const CHILD_FUSE_FD = 3;

/** A disk being served as a file. */
export interface ExportedDisk {
  id: string;
  /** The file a VMM opens (raw format), inside the FUSE mount. */
  path: string;
  /** pid of the current serving child. */
  readonly pid: number;
  /** How many times a dead serving child was replaced (by a child that became ready). */
  readonly restarts: number;
  /**
   * Resolves when serving ended for good, after `close()` or when the child died with no
   * restarts left (the mount is then detached and the VM's disk I/O fails), with the last
   * child's exit code (null when killed by a signal).
   */
  exited: Promise<number | null>;
  /** Unmount, let the child drain and exit (SIGTERM, then SIGKILL after `stopTimeoutMs`), remove its record. Idempotent. */
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
    return readFileSync(path, "utf8").slice(-bytes);
  } catch {
    return "";
  }
}

type Child = ReturnType<typeof Bun.spawn>;

/**
 * The shutdown switch of one owner of exports (a node's VM runtime). Once `begin()` is called, a
 * serving child of an export created with this switch that exits is not replaced and its exit
 * is not logged as an error (the disk is given up as on `close()`). The owner calls it first in
 * its shutdown, before pausing/stopping VMs and closing exports. One-way; other owners' exports
 * (tests, a second node in the process) are unaffected.
 */
export class DiskShutdown {
  private begun = false;
  /** Start shutting down (idempotent). */
  begin(): void {
    this.begun = true;
  }
  /** True once `begin()` was called. */
  get active(): boolean {
    return this.begun;
  }
}

/**
 * Spawn one serving child on `fuseFd` and wait for its `ready` line.
 * @throws DiskError `disk.serve_failed` (exited early, not ready in time, unexpected output)
 */
async function spawnServer(id: string, specPath: string, logPath: string, fuseFd: number, resume: boolean, readyTimeoutMs: number): Promise<Child> {
  const logFd = openSync(logPath, "a");
  let proc: Child;
  try {
    const args = [...agentenvCommand(), "disk", "serve", "--spec", specPath, "--fuse-fd", String(CHILD_FUSE_FD)];
    if (resume) args.push("--resume");
    // own session: terminal signals to the node's process group do not reach the server
    proc = Bun.spawn(args, { stdio: ["ignore", "pipe", logFd, fuseFd], env: process.env, detached: true });
  } finally {
    closeSync(logFd);
  }
  const fail = async (why: string): Promise<never> => {
    proc.kill("SIGKILL");
    await proc.exited;
    throw new DiskError("disk.serve_failed", `disk ${id}: serving child ${why}`, { id, specPath, exitCode: proc.exitCode, stderr: tail(logPath) });
  };
  const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
  let line = "";
  let timer: Timer | undefined;
  const timeout = new Promise<"timeout">((r) => (timer = setTimeout(() => r("timeout"), readyTimeoutMs)));
  try {
    for (;;) {
      const r = await Promise.race([reader.read(), timeout]);
      if (r === "timeout") return await fail(`not ready after ${readyTimeoutMs} ms`);
      if (r.done) return await fail("exited before it was ready");
      line += new TextDecoder().decode(r.value);
      if (line.includes("\n")) break;
    }
  } finally {
    clearTimeout(timer);
    reader.releaseLock();
  }
  if (!/^ready .+$/m.test(line)) return await fail(`sent an unexpected line ${JSON.stringify(line)}`);
  return proc;
}

/**
 * Serve `image` as `<workDir>/mnt/<fileName>` from a supervised child process.
 * Files in `workDir`: `disk-<id>.json` (spec), `disk-<id>.log` (children's stderr), `mnt/` (mount).
 * @param opts.recordDir where the child's pid record goes (`<runtime_path>/disks`)
 * @param opts.shutdown the owner's shutdown switch (none: the export is only stopped by close())
 * @throws DiskError `disk.serve_failed` when the first child exits early or is not ready in
 *   time (nothing is left mounted); FuseError `fuse.open_device` / `fuse.mount`
 */
export async function exportDisk(opts: {
  id: string;
  image: DiskImageSpec;
  workDir: string;
  recordDir: string;
  fileName?: string;
  config: DiskConfig;
  shutdown?: DiskShutdown;
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

  let fuseFd = mountFuse(spec.mountPoint, config.fuseMaxWrite);
  const release = () => {
    umount2(spec.mountPoint, MNT_DETACH);
    if (fuseFd >= 0) closeSync(fuseFd);
    fuseFd = -1;
    removeRecord(opts.recordDir, id);
  };
  let proc: Child;
  try {
    proc = await spawnServer(id, specPath, logPath, fuseFd, false, config.readyTimeoutMs);
  } catch (e) {
    release();
    throw e;
  }
  const path = join(spec.mountPoint, spec.fileName);
  log.debug({ id, path, pid: proc.pid }, "disk exported");

  let closing = false;
  const shuttingDown = (): boolean => opts.shutdown?.active ?? false;
  let restarts = 0; // replacements that became ready
  let attempts = 0; // replacements tried, bounded by maxRestarts
  let resolveExited!: (code: number | null) => void;
  const exited = new Promise<number | null>((r) => (resolveExited = r));

  // Supervision: replace a dead child while restarts are left; otherwise give the disk up.
  const watch = (child: Child): void => {
    void child.exited.then(async () => {
      if (closing) return resolveExited(child.exitCode);
      // Exit code 0 only follows SIGTERM/SIGINT or an unmount (see serve.ts): someone stopped it
      // on purpose; so does any exit once the service is shutting down. Not a crash: no replacement.
      const serviceStopping = shuttingDown();
      if (child.exitCode === 0 || serviceStopping) {
        log.info({ id, pid: child.pid, exitCode: child.exitCode, signal: child.signalCode, shuttingDown: serviceStopping }, "disk server stopped");
        release();
        return resolveExited(child.exitCode);
      }
      log.error({ id, pid: child.pid, exitCode: child.exitCode, signal: child.signalCode, restarts }, "disk server died");
      while (!closing && !shuttingDown() && attempts < config.maxRestarts) {
        attempts++;
        try {
          proc = await spawnServer(id, specPath, logPath, fuseFd, true, config.readyTimeoutMs);
          restarts++;
          log.warn({ id, pid: proc.pid, restarts }, "disk server replaced");
          if (closing || shuttingDown()) proc.kill("SIGTERM");
          return watch(proc);
        } catch (e) {
          log.error({ err: e, id, restarts }, "disk server restart failed");
        }
      }
      release();
      resolveExited(child.exitCode);
    });
  };
  watch(proc);

  let closed: Promise<void> | undefined;
  const close = () =>
    (closed ??= (async () => {
      closing = true;
      // Detach the mount and drop our hold on the connection: the child's reader threads then
      // see ENODEV, it drains in-flight requests, syncs the image and exits 0.
      umount2(spec.mountPoint, MNT_DETACH);
      if (fuseFd >= 0) closeSync(fuseFd);
      fuseFd = -1;
      const child = proc;
      if (child.exitCode === null && child.signalCode === null) {
        const term = setTimeout(() => child.kill("SIGTERM"), config.stopTimeoutMs);
        const kill = setTimeout(() => child.kill("SIGKILL"), 2 * config.stopTimeoutMs);
        await child.exited;
        clearTimeout(term);
        clearTimeout(kill);
      }
      resolveExited(child.exitCode);
      removeRecord(opts.recordDir, id);
    })());

  return {
    id,
    path,
    get pid() {
      return proc.pid;
    },
    get restarts() {
      return restarts;
    },
    exited,
    close,
  };
}
