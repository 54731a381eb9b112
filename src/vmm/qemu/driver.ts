/**
 * QEMU microvm driver: spawns `qemu-system-x86_64` (inside the VM's network namespace through
 * `nsenter --net=`), drives it over QMP, supervises the process, and takes Firecracker-model
 * snapshots: device state (a migration stream with the guest RAM pages filtered out, see
 * `captureSnapshot` and ./migration.ts) plus guest memory captured separately (the shared RAM
 * file of a booted VM, or the pages a restored VM changed). A restore maps a memory image
 * privately (`memory-backend-file,share=off`: copy-on-write, the image is never modified) and
 * loads the state with `-incoming defer` + `migrate-incoming`. QEMU 7.2 has no `file:` migration
 * URI, so the state is read through `exec:cat`. Facts: docs/vm-on-this-machine.md §7 (B).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { logger } from "../../observability/log.ts";
import { kernelClockArg, kernelIpArg } from "../bootargs.ts";
import { ConsoleLog } from "../console.ts";
import { VmmError } from "../errors.ts";
import { processStartTime, removeRecord, writeRecord, type VmmRecord } from "../supervise.ts";
import { fileMappings, privatePages, ProcessMemory, readMapped } from "../../ffi/procmem.ts";
import { listenUnix, UNIX_PATH_MAX } from "../../ffi/unix-listen.ts";
import type { DriveSpec, MemoryCapture, SnapshotFiles, VmHandle, VmmDriver, VmSpec } from "../types.ts";
import { buildQemuArgs, checkPath } from "./args.ts";
import { detectAccel, hostTscKhz } from "./host.ts";
import { filterMigrationStream, type MigrationFilterStats } from "./migration.ts";
import { QmpClient, type QmpEvent } from "./qmp.ts";

const log = logger("vmm.qemu");

/** RAM block id of guest memory: the `memory-backend-file` object is created with id=mem (args.ts). */
export const RAM_BLOCK_ID = "mem";
/** Retries of `cont` refused because a migration is still being finalized (10 ms apart). */
const CONT_RETRIES = 100;
/** QEMU's descriptor of the QMP listening socket: the first one after stdin, stdout, stderr. */
const QMP_CHILD_FD = 3;
/** Migration rate limit for snapshots, bytes/s: effectively none (the VM is paused, the stream local). */
const MIGRATION_MAX_BANDWIDTH = 2 ** 40;

function writeAll(fd: number, b: Uint8Array): void {
  for (let o = 0; o < b.length; ) o += writeSync(fd, b, o, b.length - o);
}

async function withTimeout<T>(p: Promise<T>, ms: number, err: () => Error): Promise<T> {
  let t: Timer | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (t = setTimeout(() => reject(err()), ms)))]);
  } finally {
    clearTimeout(t);
  }
}

/** Settings of the QEMU driver (from the `[qemu]` and `[vm]` config sections). */
export interface QemuDriverOptions {
  /** qemu-system-x86_64 path or name on PATH. */
  binary: string;
  accel: "auto" | "kvm" | "tcg";
  /** -cpu model; "max" under TCG (Bun needs x86-64-v2). Under KVM "host" is used when this is "max". */
  cpu: string;
  /** tsc_early_khz for TCG; 0 reads the host's /proc/cpuinfo. */
  tscKhz: number;
  /** TCG translation cache in MiB; 0 keeps QEMU's default (the largest per-VM memory cost under TCG). */
  tcgTbSizeMiB: number;
  /** The same for a VM restored from a snapshot (`restore`); 0 keeps QEMU's default. */
  tcgTbSizeRestoreMiB: number;
  /** Where VMM records and QMP sockets live (`<runtimeDir>/vmm/`). */
  runtimeDir: string;
  /** Directory of the guest RAM files of booted VMs (`<memoryDir>/<id>.mem`); tmpfs is best. */
  memoryDir: string;
  stopTimeoutMs: number;
  socketTimeoutMs: number;
  /** Guest console log rotation threshold in bytes (`<workDir>/console.log`, one `.1` kept). */
  consoleMaxBytes: number;
  qmpTimeoutMs: number;
}

/** Lifecycle of one QEMU VM. */
export type QemuVmState = "running" | "paused" | "stopped" | "failed";

// pci=off: microvm has no PCI host bridge here (avoids probing one and its "No config space" error).
// pty.legacy_count=0: no BSD-style /dev/ptyXX pairs (256 by default; /dev/ptmx and /dev/pts, which
// openpty and envd use, stay): their registration took 104 ms of a TCG boot's kernel time
// (initcall_debug: pty_init 103.6 ms, 1.6 ms with it).
const BASE_CMDLINE = "console=ttyS0 quiet panic=1 pci=off pty.legacy_count=0";

/** The QEMU implementation of `VmmDriver`. */
export class QemuDriver implements VmmDriver {
  readonly name = "qemu" as const;
  readonly accel: "kvm" | "tcg";
  private readonly tsc: number | null;

  constructor(readonly opts: QemuDriverOptions) {
    this.accel = opts.accel === "auto" ? detectAccel() : opts.accel;
    this.tsc = opts.tscKhz > 0 ? opts.tscKhz : hostTscKhz();
  }

  /** Kernel command line for `spec`: base + TSC hint (TCG) + ip= + clock + the template's args. */
  cmdline(spec: VmSpec): string {
    const parts = [BASE_CMDLINE];
    if (this.accel === "tcg" && this.tsc) parts.push(`tsc_early_khz=${this.tsc}`);
    if (spec.net) parts.push(kernelIpArg(spec.net));
    parts.push(kernelClockArg(), spec.bootArgs);
    return parts.filter(Boolean).join(" ");
  }

  /** TCG translation cache size (MiB, 0 = QEMU's default) of a booted VM, or of a restored one when `restore`. */
  tcgTbSizeMiBFor(restore: boolean): number {
    return restore ? this.opts.tcgTbSizeRestoreMiB : this.opts.tcgTbSizeMiB;
  }

  /**
   * Boot a VM; resolves once QEMU runs and answers QMP (the guest is booting).
   * @throws VmmError `vmm.bad_spec`, `vmm.spawn_failed`, `vmm.qmp_connect` (with QEMU's stderr).
   */
  async boot(spec: VmSpec): Promise<QemuVm> {
    mkdirSync(this.opts.memoryDir, { recursive: true });
    const memPath = join(this.opts.memoryDir, `${spec.id}.mem`);
    rmSync(memPath, { force: true });
    return await this.start(spec, { memPath, memShared: true, ownsMem: true, incoming: false });
  }

  /**
   * Start a VM from snapshot files: the device state `captureSnapshot` wrote and a file holding
   * the guest RAM (a shared memory image). The memory file is mapped copy-on-write and never
   * modified, so several VMs may restore from one image. `spec` must describe the same machine
   * (memory, vCPUs, devices, MAC) as the snapshotted VM.
   * @throws VmmError `vmm.snapshot_missing`, `vmm.restore_failed`, plus those of `boot`.
   */
  async restore(spec: VmSpec, files: SnapshotFiles, opts: { resume: boolean }): Promise<QemuVm> {
    for (const p of [files.statePath, files.memPath]) {
      checkPath(p, "snapshotPath");
      if (!existsSync(p)) throw new VmmError("vmm.snapshot_missing", `snapshot file ${p} not found`, { id: spec.id, path: p });
    }
    const vm = await this.start(spec, { memPath: files.memPath, memShared: false, ownsMem: false, incoming: true });
    try {
      await vm.migrate("restore", "migrate-incoming", `exec:cat ${files.statePath}`);
      const st = await vm.qmp.execute<{ status: string }>("query-status");
      vm.state = st.status === "running" ? "running" : "paused";
      if (opts.resume && vm.state !== "running") await vm.resume();
      return vm;
    } catch (e) {
      await vm.stop();
      if (e instanceof VmmError && e.code === "vmm.restore_failed") throw e;
      throw new VmmError("vmm.restore_failed", `restore of ${spec.id} failed: ${(e as Error).message} ${vm.stderrTail(500)}`, {
        id: spec.id,
        files,
        stderr: vm.stderrTail(),
        console: vm.consoleTail(),
      }, { cause: e });
    }
  }

  private async start(spec: VmSpec, m: { memPath: string; memShared: boolean; ownsMem: boolean; incoming: boolean }): Promise<QemuVm> {
    const vmmDir = join(this.opts.runtimeDir, "vmm");
    mkdirSync(vmmDir, { recursive: true });
    mkdirSync(spec.workDir, { recursive: true });
    const qmpPath = join(vmmDir, `${spec.id}.qmp`);
    if (Buffer.byteLength(qmpPath) > UNIX_PATH_MAX) throw new VmmError("vmm.bad_spec", `QMP socket path too long for AF_UNIX: ${qmpPath}`, { qmpPath });
    const consolePath = join(spec.workDir, "console.log");
    const args = buildQemuArgs(spec, {
      accel: this.accel,
      tcgTbSizeMiB: this.tcgTbSizeMiBFor(m.incoming),
      cpu: this.accel === "kvm" && this.opts.cpu === "max" ? "host" : this.opts.cpu,
      tscKhz: this.tsc,
      memPath: m.memPath,
      memShared: m.memShared,
      qmpFd: QMP_CHILD_FD,
      cmdline: this.cmdline(spec),
      incoming: m.incoming,
    });
    const argv = spec.net ? ["nsenter", `--net=${checkPath(spec.net.netnsPath, "netnsPath")}`, "--", this.opts.binary, ...args] : [this.opts.binary, ...args];
    // QMP's listening socket is made here and inherited as QEMU's fd 3 (nsenter keeps it): the
    // connect below is queued until QEMU accepts, instead of polling for QEMU to bind it
    let qmpListen: number;
    try {
      qmpListen = listenUnix(qmpPath);
    } catch (e) {
      throw new VmmError("vmm.spawn_failed", `cannot make the QMP socket ${qmpPath}: ${(e as Error).message}`, { id: spec.id, qmpPath }, { cause: e });
    }
    const spawnedAt = performance.now();
    let child: ReturnType<typeof spawn>;
    const noQemu = () => rmSync(qmpPath, { force: true }); // no record owns the socket file yet
    try {
      // detached: setsid(2) before exec (nsenter then execs QEMU, so the pid stays QEMU's). In its
      // own session QEMU does not get the SIGINT a terminal sends to the node's process group on
      // Ctrl-C, and lives until the node's shutdown pauses/snapshots/stops it.
      child = spawn(argv[0]!, argv.slice(1), { stdio: ["ignore", "pipe", "pipe", qmpListen], detached: true });
    } catch (e) {
      noQemu();
      throw new VmmError("vmm.spawn_failed", `cannot spawn ${argv[0]}: ${(e as Error).message}`, { id: spec.id, argv0: argv[0] }, { cause: e });
    } finally {
      // QEMU holds its copy; ours would keep the socket listening after QEMU died
      closeSync(qmpListen);
    }
    const pid = child.pid;
    if (pid === undefined) {
      const err = await new Promise<Error>((r) => child.once("error", r));
      noQemu();
      throw new VmmError("vmm.spawn_failed", `cannot spawn ${argv[0]}: ${err.message}`, { id: spec.id, argv0: argv[0] });
    }
    const rec: VmmRecord = {
      id: spec.id,
      driver: "qemu",
      pid,
      startTime: processStartTime(pid) ?? 0,
      ownedFiles: m.ownsMem ? [m.memPath, qmpPath] : [qmpPath],
    };
    writeRecord(this.opts.runtimeDir, rec);
    const vm = new QemuVm(spec, child, pid, rec, this.opts, consolePath, m.memPath, m.memShared, m.incoming ? "paused" : "running");
    try {
      vm.qmp = await QmpClient.connect(qmpPath, this.opts.socketTimeoutMs, () => vm.state !== "failed" && vm.state !== "stopped");
    } catch (e) {
      await vm.stop();
      throw new VmmError("vmm.spawn_failed", `QEMU for ${spec.id} did not come up: ${vm.stderrTail() || (e as Error).message}`, {
        id: spec.id,
        stderr: vm.stderrTail(),
      }, { cause: e });
    }
    vm.spawnMs = Math.round(performance.now() - spawnedAt);
    log.info({ id: spec.id, pid, accel: this.accel, restore: m.incoming, spawnMs: vm.spawnMs }, "qemu started");
    return vm;
  }
}

/** A QEMU process running one VM. */
export class QemuVm implements VmHandle {
  readonly id: string;
  /** Resolves with QEMU's exit code (null when killed by a signal) once the process is gone and its files removed. */
  readonly exited: Promise<number | null>;
  state: QemuVmState;
  /** @internal set by the driver once connected. */
  qmp!: QmpClient;
  /** ms from spawn until QMP answered (set by the driver). */
  spawnMs = 0;
  private stderr = "";
  private stopping = false;

  constructor(
    readonly spec: VmSpec,
    private readonly child: ChildProcess,
    readonly pid: number,
    private readonly rec: VmmRecord,
    private readonly opts: QemuDriverOptions,
    /** Serial console output of the guest (bounded: rotated to `.1` at `consoleMaxBytes`). */
    readonly consolePath: string,
    /** Guest RAM file this VM maps. */
    readonly memPath: string,
    /** True when guest RAM maps `memPath` shared (booted VM); false for a copy-on-write restore. */
    readonly memShared: boolean,
    initial: QemuVmState,
  ) {
    this.id = spec.id;
    this.state = initial;
    const consoleLog = new ConsoleLog(consolePath, opts.consoleMaxBytes, spec.onConsoleLine);
    child.stdout!.on("data", (d: Buffer) => consoleLog.write(d));
    child.stdout!.once("close", () => consoleLog.close());
    child.stderr!.on("data", (d: Buffer) => {
      this.stderr = (this.stderr + d.toString()).slice(-4000);
    });
    this.exited = new Promise((resolve) => {
      // "close" (not "exit"): fires once stdout is drained too, so the console log is complete
      child.once("close", (code) => {
        if (!this.stopping) {
          this.state = "failed";
          log.error({ id: this.id, pid, code, stderr: this.stderr.slice(-1000), console: this.consoleTail(1000) }, "qemu exited unexpectedly");
        } else this.state = "stopped";
        this.qmp?.close();
        removeRecord(opts.runtimeDir, rec);
        resolve(code);
      });
    });
  }

  /** Last `n` bytes of QEMU's stderr. */
  stderrTail(n = 2000): string {
    return this.stderr.slice(-n);
  }

  /** Last `n` bytes of the guest console. */
  consoleTail(n = 2000): string {
    try {
      return readFileSync(this.consolePath, "utf8").slice(-n);
    } catch {
      return "";
    }
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
      throw new VmmError("vmm.snapshot_failed", `snapshot of ${this.id} failed: ${(e as Error).message}`, { id: this.id, stderr: this.stderrTail() }, { cause: e });
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
    if (this.child.exitCode === null && this.child.signalCode === null) {
      try {
        await this.qmp?.execute("quit", undefined, Math.min(1000, this.opts.stopTimeoutMs));
      } catch {
        // fall through to the kill
      }
      const t = setTimeout(() => this.child.kill("SIGKILL"), this.opts.stopTimeoutMs);
      await this.exited;
      clearTimeout(t);
    } else await this.exited;
  }
}
