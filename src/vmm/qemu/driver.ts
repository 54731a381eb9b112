/**
 * QEMU microvm driver: spawns `qemu-system-x86_64` (inside the VM's network namespace through
 * `nsenter --net=`), drives it over QMP, supervises the process, and takes Firecracker-model
 * snapshots: device state (a migration stream with the guest RAM pages filtered out, see
 * `captureSnapshot` and ./migration.ts) plus guest memory captured separately (the shared RAM
 * file of a booted VM, or the pages a restored VM changed). A restore maps a memory image
 * privately (`memory-backend-file,share=off`: copy-on-write, the image is never modified) and
 * loads the state with `-incoming defer` + `migrate-incoming`. QEMU 7.2 has no `file:` migration
 * URI, so the state is read through `exec:cat`. Facts: docs/vm-on-this-machine.md §7 (B).
 *
 * Nothing of a running QEMU hangs on the node that spawned it (issue 27): QMP and the serial
 * console are Unix sockets QEMU listens on (made by the driver, passed as fds 3 and 4), its own
 * stdout and stderr go to `<workDir>/qemu.log`, and it runs in a session of its own. A node that
 * starts after the spawning one died takes it over with `attach` (./vm.ts is the handle).
 */
import { spawn } from "node:child_process";
import { closeSync, existsSync, mkdirSync, openSync, rmSync, statfsSync, statSync } from "node:fs";
import { join } from "node:path";
import { logger } from "../../observability/log.ts";
import { errorMessage } from "../../util/error.ts";
import { listenUnix, UNIX_PATH_MAX } from "../../ffi/unix-listen.ts";
import { holdRecorded, lost } from "../adopt.ts";
import { kernelClockArg, kernelIpArg } from "../bootargs.ts";
import { VmmError } from "../errors.ts";
import { childVmm, heldVmm } from "../process.ts";
import { processStartTime, writeRecord, type VmmRecord } from "../supervise.ts";
import type { AttachOptions, SnapshotFiles, VmmAttachResult, VmmDriver, VmSpec } from "../types.ts";
import { buildQemuArgs, checkPath, MACHINE } from "./args.ts";
import { detectAccel, hostTscKhz } from "./host.ts";
import { QmpClient } from "./qmp.ts";
import type { QemuDriverOptions } from "./options.ts";
import { QemuVm, type QemuVmState } from "./vm.ts";
import { stateDevices } from "./vmdesc.ts";

export { QemuVm, RAM_BLOCK_ID, type QemuVmState } from "./vm.ts";
export type { QemuDriverOptions } from "./options.ts";

const log = logger("vmm.qemu");

/** QEMU's descriptor of the QMP listening socket: the first one after stdin, stdout, stderr. */
const QMP_CHILD_FD = 3;
/** QEMU's descriptor of the serial console's listening socket. */
const CONSOLE_CHILD_FD = 4;
/** Record fields `attach` needs (records of nodes before issue 27 lack them). */
const ATTACH_NEEDS: (keyof VmmRecord)[] = ["argv", "workDir", "controlSocket", "consoleSocket", "consolePath", "logPath", "memPath", "memShared"];

// pci=off: microvm has no PCI host bridge here (avoids probing one and its "No config space" error).
// pty.legacy_count=0: no BSD-style /dev/ptyXX pairs (256 by default; /dev/ptmx and /dev/pts, which
// openpty and envd use, stay): their registration took 104 ms of a TCG boot's kernel time
// (initcall_debug: pty_init 103.6 ms, 1.6 ms with it).
const BASE_CMDLINE = "console=ttyS0 quiet panic=1 pci=off pty.legacy_count=0";

/** statfs(2) f_type of FUSE (linux/magic.h). */
const FUSE_SUPER_MAGIC = 0x65735546;

/**
 * A VM with the free page reporting balloon discards the ranges its guest reports free by
 * punching them in its RAM file (QEMU 7.2 ram_block_discard_range), also when it maps that file
 * privately: a restore's memory image must be one that survives it. The node's shared memory
 * export (FUSE, read-only, acceptWritableOpen) treats the punch as a hint and a block device
 * refuses it; a plain file would lose the ranges for every later restore from it.
 * @throws VmmError `vmm.bad_spec` for a regular file outside FUSE
 */
function punchSafe(memPath: string, id: string): void {
  const st = statSync(memPath);
  if (st.isBlockDevice() || (st.isFile() && statfsSync(memPath).type === FUSE_SUPER_MAGIC)) return;
  throw new VmmError(
    "vmm.bad_spec",
    `memory image ${memPath} is a plain file: the snapshot's VM has a free page reporting balloon, whose discards would punch holes in it; restore from the disk daemon's shared export of it`,
    { id, memPath },
  );
}

/** The QEMU implementation of `VmmDriver`. */
export class QemuDriver implements VmmDriver {
  readonly name = "qemu" as const;
  readonly accel: "kvm" | "tcg";
  /** `VmmDriver.machineKey`: the machine options, the command line's fixed words (TSC rate aside), the CPU model, the balloon. */
  readonly machineKey: string;
  private readonly tsc: number | null;

  constructor(readonly opts: QemuDriverOptions) {
    this.accel = opts.accel === "auto" ? detectAccel() : opts.accel;
    this.tsc = opts.tscKhz > 0 ? opts.tscKhz : hostTscKhz();
    const fixed = this.baseCmdline().filter((w) => !w.startsWith("tsc_early_khz="));
    const machine = JSON.stringify({ machine: MACHINE, cmdline: fixed, accel: this.accel, cpu: opts.cpu, balloon: opts.freePageReporting });
    this.machineKey = new Bun.CryptoHasher("sha256").update(machine).digest("hex").slice(0, 16);
  }

  /** Kernel command line for `spec`: base + TSC hint (TCG) + ip= + clock + the template's args. */
  cmdline(spec: VmSpec): string {
    const parts = this.baseCmdline();
    if (spec.net) parts.push(kernelIpArg(spec.net));
    parts.push(kernelClockArg(), spec.bootArgs);
    return parts.filter(Boolean).join(" ");
  }

  /** The words every VM's command line starts with. */
  private baseCmdline(): string[] {
    const parts = BASE_CMDLINE.split(" ");
    // tsc=reliable: the guest's TSC is the host's (constant, known rate). Without it the kernel's
    // clocksource watchdog, whose only reference on microvm is the jiffies a loaded host's TCG
    // delivers late, marks the TSC unstable; the guest then keeps time in jiffies, cannot stop its
    // tick and wakes QEMU 250 times a second while idle (docs/density.md)
    if (this.accel === "tcg" && this.tsc) parts.push(`tsc_early_khz=${this.tsc}`, "tsc=reliable");
    return parts;
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
    return await this.start(spec, { memPath, memShared: true, ownsMem: true, incoming: false, balloon: this.opts.freePageReporting });
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
    // QEMU must be given the devices the snapshot's VM had (a PIT, the balloon): its device state
    // says which, whatever node version took it
    const devices = stateDevices(files.statePath);
    const has = (vmsd: string) => devices?.some((d) => d.vmsdName === vmsd) ?? false;
    const balloon = has("virtio-balloon");
    if (balloon) punchSafe(files.memPath, spec.id);
    const vm = await this.start(spec, { memPath: files.memPath, memShared: false, ownsMem: false, incoming: true, balloon, pit: has("i8254") });
    try {
      await vm.migrate("restore", "migrate-incoming", `exec:cat ${files.statePath}`);
      const st = await vm.qmp.execute<{ status: string }>("query-status");
      vm.state = st.status === "running" ? "running" : "paused";
      if (opts.resume && vm.state !== "running") await vm.resume();
      return vm;
    } catch (e) {
      await vm.stop();
      if (e instanceof VmmError && e.code === "vmm.restore_failed") throw e;
      throw new VmmError("vmm.restore_failed", `restore of ${spec.id} failed: ${errorMessage(e)} ${vm.stderrTail(500)}`, {
        id: spec.id,
        files,
        stderr: vm.stderrTail(),
        console: vm.consoleTail(),
      }, { cause: e });
    }
  }

  /**
   * Take over the QEMU a previous node started, from its record: prove the process is that QEMU
   * (../adopt.ts), connect to its QMP socket (the dead node's connection is gone, so QEMU accepts
   * a new one) and check it answers as `aenv-<id>`, connect to its console socket (the log goes
   * on in the same file), and read the VM's state. A VM running or paused (also after a capture:
   * QEMU's `postmigrate`) is adopted; a VMM that does not answer, answers as another VM, or is in
   * any other state (a restore cut halfway: `inmigrate`; a guest stopped on an I/O error or a
   * panic) is killed and reported lost. Console output the guest wrote while no node was
   * connected is not in the log (QEMU drops it).
   * @returns `attached` with a handle like `boot`'s (spawnMs 0; `exited` resolves null), or `lost`
   */
  async attach(rec: VmmRecord, opts: AttachOptions = {}): Promise<VmmAttachResult> {
    const held = await holdRecorded(rec, "qemu", ATTACH_NEEDS, this.opts.stopTimeoutMs);
    if (!("proc" in held)) return held;
    const proc = heldVmm(held.proc);
    const vm = new QemuVm({
      id: rec.id, proc, rec, consoleSocket: rec.consoleSocket!, consolePath: rec.consolePath!, logPath: rec.logPath!,
      memPath: rec.memPath!, memShared: rec.memShared!, state: "running", onConsoleLine: opts.onConsoleLine, appendConsole: true,
    }, this.opts);
    let state: QemuVmState;
    try {
      vm.qmp = await QmpClient.connect(rec.controlSocket!, this.opts.socketTimeoutMs, () => proc.running);
      const name = await vm.qmp.execute<{ name?: string }>("query-name");
      if (name.name !== `aenv-${rec.id}`) {
        await vm.kill();
        return lost(rec.id, "record_invalid", `QMP socket ${rec.controlSocket} answers as ${JSON.stringify(name.name)}, not aenv-${rec.id}`);
      }
      await vm.attachConsole();
      const st = await vm.qmp.execute<{ status: string }>("query-status");
      const s = ADOPTABLE[st.status];
      if (!s) {
        await vm.kill();
        return lost(rec.id, "bad_state", `VM status ${st.status}`);
      }
      state = s;
    } catch (e) {
      const died = !proc.running;
      await vm.kill();
      return died ? lost(rec.id, "gone", `QEMU ${rec.pid} exited while being adopted: ${errorMessage(e)}`) : lost(rec.id, "unresponsive", `QEMU ${rec.pid} did not answer: ${errorMessage(e)}`);
    }
    vm.state = state;
    log.info({ id: rec.id, pid: rec.pid, state }, "qemu adopted");
    return { kind: "attached", vm };
  }

  private async start(spec: VmSpec, m: { memPath: string; memShared: boolean; ownsMem: boolean; incoming: boolean; balloon: boolean; pit?: boolean }): Promise<QemuVm> {
    const vmmDir = join(this.opts.runtimeDir, "vmm");
    mkdirSync(vmmDir, { recursive: true });
    mkdirSync(spec.workDir, { recursive: true });
    const qmpPath = join(vmmDir, `${spec.id}.qmp`);
    const consoleSocket = join(vmmDir, `${spec.id}.con`);
    for (const p of [qmpPath, consoleSocket]) {
      if (Buffer.byteLength(p) > UNIX_PATH_MAX) throw new VmmError("vmm.bad_spec", `socket path too long for AF_UNIX: ${p}`, { path: p });
    }
    const consolePath = join(spec.workDir, "console.log");
    const logPath = join(spec.workDir, "qemu.log");
    const args = buildQemuArgs(spec, {
      accel: this.accel,
      tcgTbSizeMiB: this.tcgTbSizeMiBFor(m.incoming),
      cpu: this.accel === "kvm" && this.opts.cpu === "max" ? "host" : this.opts.cpu,
      tscKhz: this.tsc,
      memPath: m.memPath,
      memShared: m.memShared,
      qmpFd: QMP_CHILD_FD,
      consoleFd: CONSOLE_CHILD_FD,
      cmdline: this.cmdline(spec),
      incoming: m.incoming,
      balloon: m.balloon,
      pit: m.pit,
      memMerge: this.opts.memMerge,
    });
    const qemuArgv = [this.opts.binary, ...args];
    const argv = spec.net ? ["nsenter", `--net=${checkPath(spec.net.netnsPath, "netnsPath")}`, "--", ...qemuArgv] : qemuArgv;
    // QMP's and the console's listening sockets are made here and inherited as QEMU's fds 3 and
    // 4 (nsenter keeps them): the connects below are queued until QEMU accepts, instead of
    // polling for QEMU to bind them
    const listening: number[] = [];
    const noQemu = () => {
      for (const p of [qmpPath, consoleSocket]) rmSync(p, { force: true }); // no record owns them yet
    };
    let logFd: number;
    try {
      for (const p of [qmpPath, consoleSocket]) listening.push(listenUnix(p));
      logFd = openSync(logPath, "w");
    } catch (e) {
      for (const fd of listening) closeSync(fd);
      noQemu();
      throw new VmmError("vmm.spawn_failed", `cannot make the sockets of ${spec.id}: ${errorMessage(e)}`, { id: spec.id, qmpPath, consoleSocket }, { cause: e });
    }
    const spawnedAt = performance.now();
    let child: ReturnType<typeof spawn>;
    try {
      // detached: setsid(2) before exec (nsenter then execs QEMU, so the pid stays QEMU's). In its
      // own session QEMU does not get the SIGINT a terminal sends to the node's process group on
      // Ctrl-C, and lives until the node's shutdown pauses/snapshots/stops it.
      child = spawn(argv[0]!, argv.slice(1), { stdio: ["ignore", logFd, logFd, listening[0]!, listening[1]!], detached: true });
    } catch (e) {
      noQemu();
      throw new VmmError("vmm.spawn_failed", `cannot spawn ${argv[0]}: ${errorMessage(e)}`, { id: spec.id, argv0: argv[0] }, { cause: e });
    } finally {
      // QEMU holds its copies; ours would keep the sockets listening after QEMU died
      for (const fd of listening) closeSync(fd);
      closeSync(logFd);
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
      ownedFiles: m.ownsMem ? [m.memPath, qmpPath, consoleSocket] : [qmpPath, consoleSocket],
      argv: qemuArgv,
      workDir: spec.workDir,
      controlSocket: qmpPath,
      consoleSocket,
      consolePath,
      logPath,
      memPath: m.memPath,
      memShared: m.memShared,
    };
    writeRecord(this.opts.runtimeDir, rec);
    const proc = childVmm(child, pid);
    const vm = new QemuVm({
      id: spec.id, proc, rec, consoleSocket, consolePath, logPath, memPath: m.memPath, memShared: m.memShared,
      state: m.incoming ? "paused" : "running", onConsoleLine: spec.onConsoleLine, appendConsole: false,
    }, this.opts);
    try {
      // the console first: QEMU waits for it (wait=on) before it gets to QMP
      const console = vm.attachConsole();
      console.catch(() => {}); // awaited below; a QMP failure first must not leave it unhandled
      vm.qmp = await QmpClient.connect(qmpPath, this.opts.socketTimeoutMs, () => proc.running);
      await console;
    } catch (e) {
      await vm.stop();
      throw new VmmError("vmm.spawn_failed", `QEMU for ${spec.id} did not come up: ${vm.stderrTail() || errorMessage(e)}`, {
        id: spec.id,
        stderr: vm.stderrTail(),
      }, { cause: e });
    }
    vm.spawnMs = Math.round(performance.now() - spawnedAt);
    log.info({ id: spec.id, pid, accel: this.accel, restore: m.incoming, spawnMs: vm.spawnMs }, "qemu started");
    return vm;
  }
}

/** QEMU run states (qapi/run-state.json `RunState`) an adopted VM can go on from, as handle states. */
const ADOPTABLE: Record<string, QemuVmState> = { running: "running", paused: "paused", postmigrate: "paused" };
