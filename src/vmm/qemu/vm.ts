/**
 * One QEMU VM as a handle (`VmHandle`): QMP commands (pause, resume, drive resize), snapshots
 * (device state through a filtered migration stream, guest RAM captured separately: see
 * `captureSnapshot`), stop and detach. Made by the driver from a fresh spawn or from a record
 * a previous node left (./driver.ts `attach`).
 */
import { closeSync, fstatSync, fsyncSync, openSync, readSync, rmSync, writeSync } from "node:fs";
import { connect, createServer, type Socket } from "node:net";
import { join } from "node:path";
import { logger } from "../../observability/log.ts";
import { errorMessage } from "../../util/error.ts";
import { fileMappings, privatePages, ProcessMemory, readMapped } from "../../ffi/procmem.ts";
import { ConsoleLog } from "../console.ts";
import { VmmError } from "../errors.ts";
import type { VmmProcess } from "../process.ts";
import { removeRecord, type VmmRecord } from "../supervise.ts";
import type { DriveSpec, MemoryCapture, VmHandle } from "../types.ts";
import { checkPath } from "./args.ts";
import type { QemuDriverOptions } from "./options.ts";
import { filterMigrationStream, type MigrationFilterStats } from "./migration.ts";
import { QmpClient, type QmpEvent } from "./qmp.ts";
import { withTimeout } from "../../util/timeout.ts";

const log = logger("vmm.qemu");

/** RAM block id of guest memory: the `memory-backend-file` object is created with id=mem (args.ts). */
export const RAM_BLOCK_ID = "mem";
/** Retries of `cont` refused because a migration is still being finalized (10 ms apart). */
const CONT_RETRIES = 100;
/** Migration rate limit for snapshots, bytes/s: effectively none (the VM is paused, the stream local). */
const MIGRATION_MAX_BANDWIDTH = 2 ** 40;
/** Longest wait after QEMU's exit for its console socket to deliver its last bytes, ms. */
const CONSOLE_DRAIN_MS = 1000;

/** Lifecycle of one QEMU VM. */
export type QemuVmState = "running" | "paused" | "stopped" | "failed";

function writeAll(fd: number, b: Uint8Array): void {
  for (let o = 0; o < b.length; ) o += writeSync(fd, b, o, b.length - o);
}


/** The last `n` bytes of the file at `path` as text ("" when it cannot be read). */
export function tailFile(path: string, n: number): string {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch {
    return "";
  }
  try {
    const size = fstatSync(fd).size;
    const len = Math.min(n, size);
    const buf = Buffer.alloc(len);
    let got = 0;
    while (got < len) {
      const r = readSync(fd, buf, got, len - got, size - len + got);
      if (r === 0) break;
      got += r;
    }
    return buf.subarray(0, got).toString("utf8");
  } finally {
    closeSync(fd);
  }
}

/** What a `QemuVm` is made of: from a fresh spawn (./driver.ts) or from a record (./attach.ts). */
export interface QemuVmParts {
  id: string;
  proc: VmmProcess;
  rec: VmmRecord;
  /** Serial console socket (QEMU listens, the node connects). */
  consoleSocket: string;
  /** Guest console log (bounded: rotated to `.1` at `consoleMaxBytes`). */
  consolePath: string;
  /** File QEMU's stdout and stderr go to. */
  logPath: string;
  /** Guest RAM file this VM maps. */
  memPath: string;
  /** True when guest RAM maps `memPath` shared (booted VM); false for a copy-on-write restore. */
  memShared: boolean;
  state: QemuVmState;
  onConsoleLine?: (line: string) => void;
  /** Continue the console log (adoption) instead of starting it afresh. */
  appendConsole: boolean;
}

/** A QEMU process running one VM. */
export class QemuVm implements VmHandle {
  readonly id: string;
  readonly pid: number;
  /**
   * Resolves with QEMU's exit code (null when killed by a signal, or for an adopted QEMU, whose
   * exit code a node that did not spawn it cannot read) once the process is gone, its console
   * read to the end and its files removed.
   */
  readonly exited: Promise<number | null>;
  state: QemuVmState;
  /** @internal set by the driver once connected. */
  qmp!: QmpClient;
  /** ms from spawn until QMP answered (set by the driver; 0 for an adopted VM). */
  spawnMs = 0;
  /** Serial console output of the guest (bounded: rotated to `.1` at `consoleMaxBytes`). */
  readonly consolePath: string;
  /** File holding QEMU's own stdout and stderr. */
  readonly logPath: string;
  /** Guest RAM file this VM maps. */
  readonly memPath: string;
  /** True when guest RAM maps `memPath` shared (booted VM); false for a copy-on-write restore. */
  readonly memShared: boolean;
  /** The record this handle owns (removed with the VM's files at exit). */
  readonly record: VmmRecord;
  readonly startTime: number;
  readonly controlSocket: string;
  private readonly proc: VmmProcess;
  private readonly consoleSocket: string;
  private readonly console: ConsoleLog;
  private consoleConn: Socket | undefined;
  private consoleClosed: Promise<void> | undefined;
  private stopping = false;

  constructor(p: QemuVmParts, private readonly opts: QemuDriverOptions) {
    this.id = p.id;
    this.pid = p.proc.pid;
    this.proc = p.proc;
    this.record = p.rec;
    this.startTime = p.rec.startTime;
    this.controlSocket = p.rec.controlSocket ?? "";
    this.state = p.state;
    this.consolePath = p.consolePath;
    this.logPath = p.logPath;
    this.memPath = p.memPath;
    this.memShared = p.memShared;
    this.consoleSocket = p.consoleSocket;
    this.console = new ConsoleLog(p.consolePath, opts.consoleMaxBytes, p.onConsoleLine, p.appendConsole);
    this.exited = p.proc.exited.then(async (code) => {
      // the console socket closes with QEMU; its last bytes are read before the log closes
      await withTimeout(this.consoleClosed ?? Promise.resolve(), CONSOLE_DRAIN_MS, () => new Error("console drain")).catch(() => this.consoleConn?.destroy());
      this.console.close();
      if (!this.stopping) {
        this.state = "failed";
        log.error({ id: this.id, pid: this.pid, code, stderr: this.stderrTail(1000), console: this.consoleTail(1000) }, "qemu exited unexpectedly");
      } else this.state = "stopped";
      this.qmp?.close();
      removeRecord(opts.runtimeDir, p.rec);
      return code;
    });
  }

  /** True while the vCPUs are stopped (a pause, a capture, a restore not yet continued). */
  get paused(): boolean {
    return this.state === "paused";
  }

  /**
   * @internal Connect to the console socket and copy what it sends into the console log until
   * it closes. A fresh QEMU waits for this connection before it runs the guest; an adopted one
   * accepts it once the previous node's connection is gone.
   * @throws VmmError `vmm.spawn_failed` when the socket does not accept within `socketTimeoutMs`
   */
  async attachConsole(): Promise<void> {
    const sock = await new Promise<Socket>((resolve, reject) => {
      const s = connect(this.consoleSocket);
      const timer = setTimeout(() => {
        s.destroy();
        reject(new VmmError("vmm.spawn_failed", `console socket ${this.consoleSocket} of ${this.id} did not accept in ${this.opts.socketTimeoutMs} ms`, { id: this.id, socket: this.consoleSocket }));
      }, this.opts.socketTimeoutMs);
      s.once("connect", () => {
        clearTimeout(timer);
        resolve(s);
      });
      s.once("error", (e) => {
        clearTimeout(timer);
        reject(new VmmError("vmm.spawn_failed", `cannot connect to the console socket ${this.consoleSocket} of ${this.id}: ${errorMessage(e)}`, { id: this.id, socket: this.consoleSocket }, { cause: e }));
      });
    });
    this.consoleConn = sock;
    sock.on("data", (d: Buffer) => this.console.write(d));
    sock.on("error", () => {});
    this.consoleClosed = new Promise((r) => sock.once("close", () => r()));
  }

  /** Last `n` bytes QEMU wrote to its stdout and stderr (its log file). */
  stderrTail(n = 2000): string {
    return tailFile(this.logPath, n);
  }

  /** Last `n` bytes of the guest console. */
  consoleTail(n = 2000): string {
    return tailFile(this.consolePath, n);
  }

  private alive(op: string): void {
    if (this.state === "stopped" || this.state === "failed") {
      throw new VmmError("vmm.not_running", `VM ${this.id} is ${this.state}; cannot ${op}`, { id: this.id, state: this.state, op });
    }
  }

  /** `VmHandle.driveResized`: QMP `block_resize` of the drive (its -drive id) to `bytes`. */
  async driveResized(drive: Pick<DriveSpec, "id" | "path">, bytes: number): Promise<void> {
    this.alive("driveResized");
    await this.qmp.execute("block_resize", { device: drive.id, size: bytes });
  }

  /** Freeze the vCPUs (QMP `stop`). @throws VmmError `vmm.not_running`, `vmm.qmp_error`. */
  async pause(): Promise<void> {
    this.alive("pause");
    await this.qmp.execute("stop");
    this.state = "paused";
  }

  /**
   * Continue the vCPUs (QMP `cont`). Right after a migration QEMU may still be finishing it in
   * its main loop and refuse with "Migration is not finalized yet": that is retried (every 10 ms,
   * at most `CONT_RETRIES` times). @throws VmmError `vmm.not_running`, `vmm.qmp_error`.
   */
  async resume(): Promise<void> {
    this.alive("resume");
    for (let i = 0; ; i++) {
      try {
        await this.qmp.execute("cont");
        break;
      } catch (e) {
        const busy = e instanceof VmmError && e.code === "vmm.qmp_error" && /not finalized/i.test(e.message);
        if (!busy || i >= CONT_RETRIES) throw e;
        await Bun.sleep(10);
      }
    }
    this.state = "running";
  }

  /**
   * @internal Run a migration: turn on x-ignore-shared and QMP MIGRATION events, start it with
   * `command` (migrate / migrate-incoming), and wait for its end event (completed, failed or
   * cancelled; bounded by qmpTimeoutMs). A failure is then detailed by one query-migrate.
   */
  async migrate(op: "snapshot" | "restore", command: string, uri: string): Promise<void> {
    // Always on, on both ends: x-ignore-shared changes the stream format (RAM block addresses
    // are added). "events" makes QEMU send MIGRATION status events (qapi/migration.json).
    await this.qmp.execute("migrate-set-capabilities", {
      capabilities: [
        { capability: "x-ignore-shared", state: true },
        { capability: "events", state: true },
      ],
    });
    const mark = this.qmp.eventMark();
    await this.qmp.execute(command, { uri });
    const ended = (e: QmpEvent) => e.event === "MIGRATION" && ["completed", "failed", "cancelled"].includes(String(e.data?.status));
    let ev: QmpEvent;
    try {
      ev = await this.qmp.waitEvent(ended, this.opts.qmpTimeoutMs, mark);
    } catch (e) {
      if (e instanceof VmmError && e.code === "vmm.qmp_timeout") throw new VmmError("vmm.qmp_timeout", `${op} migration not done in ${this.opts.qmpTimeoutMs} ms`, { id: this.id }, { cause: e });
      throw e;
    }
    const status = String(ev.data?.status);
    if (status === "completed") return;
    const r = await this.qmp.execute<{ "error-desc"?: string }>("query-migrate").catch(() => ({}) as { "error-desc"?: string });
    throw new VmmError(op === "restore" ? "vmm.restore_failed" : "vmm.snapshot_failed", `${op} migration ${status}: ${r["error-desc"] ?? ""}`, {
      id: this.id,
      status,
      stderr: this.stderrTail(),
    });
  }

  /**
   * Snapshot the paused VM (see `VmHandle.captureSnapshot`). QEMU migrates over a Unix socket
   * (`<runtimeDir>/vmm/<id>.mig`) into this process, where `filterMigrationStream` drops the page
   * records of the guest RAM block, so `statePath` gets the device state only. Guest RAM:
   * - a booted VM maps its RAM file shared (x-ignore-shared keeps it out of the stream): the
   *   capture is that file;
   * - a restored VM maps its memory image privately: QEMU 7.2 streams such RAM (x-ignore-shared
   *   skips only share=on blocks), and the pages the guest wrote are the private (anonymous)
   *   pages of the mapping, found in /proc/<pid>/pagemap and read from /proc/<pid>/mem.
   * The VM ends in QEMU's "postmigrate" state: still paused; `resume()` continues it.
   *
   * Why this way (issue 9 item 5, measured by bench/pause-diff.ts on one restored 512 MiB VM
   * whose image holds 64 MiB of the original's data, for 0 / 8 / 64 MiB dirtied since the
   * restore, load 2-3): this capture writes 4.3 / 12.4 / 69.4 MiB (the changed pages and a
   * 0.2 MiB state) with the VM paused 373 / 341 / 852 ms; a full private copy (QEMU's stream with
   * RAM, what a pause wrote before) 107.5 / 115.5 / 171.6 MiB, every non-zero guest page whatever
   * changed, in 342 / 213 / 818 ms; reading all guest RAM through /proc/<pid>/mem and comparing
   * it with the image writes what this capture writes but keeps the VM paused 3-9 s. This
   * capture and the full copy pause the VM about as long (QEMU 7.2 streams
   * a share=off RAM block whole, x-ignore-shared skips only share=on ones, and the filter drops
   * it): the pagemap is what makes the bytes follow the dirty amount. Not built: a writable
   * share=on memory file over the image (its upper the diff), which would keep RAM out of the
   * stream but put a write through the export on the guest's first write to every page.
   * @throws VmmError `vmm.not_paused`, `vmm.bad_spec`, `vmm.snapshot_failed`, `vmm.stream_bad`
   */
  async captureSnapshot(statePath: string): Promise<MemoryCapture> {
    this.alive("snapshot");
    if (this.state !== "paused") throw new VmmError("vmm.not_paused", `VM ${this.id} must be paused to snapshot`, { id: this.id, state: this.state });
    checkPath(statePath, "statePath");
    if (statePath === this.memPath) throw new VmmError("vmm.bad_spec", "snapshot statePath is the live RAM file", { statePath });
    const sock = join(this.opts.runtimeDir, "vmm", `${this.id}.mig`);
    rmSync(sock, { force: true });
    const fd = openSync(statePath, "w");
    const server = createServer();
    let stats: MigrationFilterStats;
    try {
      const received = new Promise<MigrationFilterStats>((resolve, reject) => {
        server.once("connection", (conn) => {
          server.close();
          filterMigrationStream(conn, (b) => writeAll(fd, b), (block) => block === RAM_BLOCK_ID).then(resolve, (e) => {
            conn.destroy();
            reject(e);
          });
        });
        server.once("error", reject);
      });
      received.catch(() => {}); // awaited below; a QMP failure first must not leave it unhandled
      await new Promise<void>((resolve, reject) => {
        server.once("listening", resolve);
        server.once("error", reject);
        server.listen(sock);
      });
      // the default 128 MiB/s rate limit would stretch a paused VM's migration for nothing
      await this.qmp.execute("migrate-set-parameters", { "max-bandwidth": MIGRATION_MAX_BANDWIDTH });
      await this.migrate("snapshot", "migrate", `unix:${sock}`);
      stats = await withTimeout(received, this.opts.qmpTimeoutMs, () => new VmmError("vmm.snapshot_failed", `device state stream of ${this.id} did not end`, { id: this.id }));
      fsyncSync(fd);
    } catch (e) {
      if (e instanceof VmmError) throw e;
      throw new VmmError("vmm.snapshot_failed", `snapshot of ${this.id} failed: ${errorMessage(e)}`, { id: this.id, stderr: this.stderrTail() }, { cause: e });
    } finally {
      closeSync(fd);
      server.close();
      rmSync(sock, { force: true });
    }
    log.info({ id: this.id, statePath, streamBytes: stats.bytesIn, stateBytes: stats.bytesOut, ramPagesDropped: stats.pagesDropped }, "device state written");
    if (this.memShared) return { kind: "file", path: this.memPath, overParent: false, release: () => {} };
    const maps = fileMappings(this.pid, this.memPath);
    if (maps.length === 0) throw new VmmError("vmm.snapshot_failed", `QEMU ${this.pid} does not map ${this.memPath}`, { id: this.id, memPath: this.memPath });
    const ranges = privatePages(this.pid, maps);
    const mem = new ProcessMemory(this.pid);
    return { kind: "changed", ranges, read: (buf, offset) => readMapped(mem, maps, buf, offset), release: () => mem.close() };
  }

  /**
   * Stop QEMU: QMP `quit`, then SIGKILL after `stopTimeoutMs`; removes the RAM file the VM owned,
   * its QMP socket and its record. Safe to call twice or after the process died.
   */
  async stop(): Promise<void> {
    if (this.state !== "failed") this.stopping = true;
    if (this.proc.running) {
      try {
        await this.qmp?.execute("quit", undefined, Math.min(1000, this.opts.stopTimeoutMs));
      } catch {
        // fall through to the kill
      }
      const t = setTimeout(() => this.proc.kill("SIGKILL"), this.opts.stopTimeoutMs);
      await this.exited;
      clearTimeout(t);
    } else await this.exited;
  }

  /** SIGKILL QEMU at once (no QMP quit) and wait for the exit; its files and record go. */
  async kill(): Promise<void> {
    this.stopping = true;
    if (this.proc.running) this.proc.kill("SIGKILL");
    await this.exited;
  }

  /**
   * Let go of the VM without stopping it (the node hands it to the next one: issue 27's
   * detach): the QMP and console connections close, the record stays for the next node's
   * `attach`. Nothing of this handle works afterwards (do not wait on its `exited`).
   */
  detach(): void {
    this.stopping = true;
    this.state = "stopped";
    this.qmp?.close();
    this.consoleConn?.destroy();
    this.console.close();
    this.proc.release();
  }
}
