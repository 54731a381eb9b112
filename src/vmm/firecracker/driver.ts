/**
 * Firecracker driver: one `firecracker --api-sock <workDir>/firecracker.sock --id <id>` process
 * per VM (inside the VM's network namespace via nsenter when it has a NIC), configured over its
 * API socket. Serial console and Firecracker's own log go to `<workDir>/firecracker.log`
 * (the handle's `consolePath`).
 *
 * VM states and the calls allowed in each (anything else throws `vmm.bad_state`):
 *   running: pause, stop        paused: resume, snapshot, stop        exited: stop
 *
 * Captures (`captureSnapshot`, issue 9 item 5): a booted VM writes a Full snapshot (its whole RAM
 * is the first memory layer). A VM restored from a memory image with `track_dirty_pages` writes a
 * **Diff** snapshot: Firecracker dumps only the pages KVM logged as dirty, at their offsets, into
 * the memory file; into an existing file of the guest's RAM size it merges them without
 * truncating (upstream `snapshot_memory_to_file`). Reading the dirty log clears it, so every Diff
 * of one VM goes into the same sparse file `<workDir>/firecracker.dirty.mem`: its data extents
 * (SEEK_DATA/SEEK_HOLE) are every page changed since the load, holding the current bytes, and
 * become the new memory layer over the parent image (a capture, a resume, more writes and a
 * second capture lose nothing). The file costs what the guest dirtied and goes with the VM.
 * Without `track_dirty_pages` a restored VM falls back to a Full snapshot compared page by page
 * with the parent image.
 *
 * Nothing of a running Firecracker hangs on the node that spawned it (issue 27): its API socket
 * is a file, its console and log go to a file it writes, it runs in a session of its own. A node
 * that starts after the spawning one died takes it over with `attach` (API: `GET /` answers the
 * instance state). Firecracker cannot run on this host (no usable KVM): all of this is
 * tested request by request against the schema-validating stand-in
 * (test/vmm/firecracker/fake-firecracker.ts), not against a real Firecracker.
 */
import { closeSync, existsSync, fstatSync, mkdirSync, openSync, readSync, rmSync } from "node:fs";
import { join } from "node:path";
import { dataExtents } from "../../ffi/file_extents.ts";
import { errorMessage } from "../../util/error.ts";
import { holdRecorded, killHeld, lost } from "../adopt.ts";
import { VmmError } from "../errors.ts";
import { bunVmm, heldVmm, type VmmProcess } from "../process.ts";
import { processStartTime, removeRecord, writeRecord, type VmmRecord } from "../supervise.ts";
import type { AttachOptions, DriveSpec, MemoryCapture, SnapshotFiles, VmHandle, VmmAttachResult, VmmDriver, VmSpec } from "../types.ts";
import { logger } from "../../observability/log.ts";
import { FirecrackerApi, type ApiRequest } from "./api.ts";
import type { FirecrackerConfig } from "./config.ts";
import { bootRequests, patchDriveRequest, restoreRequests, snapshotCreateRequest, validateSpec, vmStateRequest } from "./requests.ts";
import { retryUntil } from "../../util/retry.ts";

const log = logger("vmm.firecracker");

/** File name (in the VM's work dir) of the sparse memory file a restored VM's Diff snapshots merge into. */
export const DIRTY_MEM_FILE = "firecracker.dirty.mem";

type VmState = "running" | "paused" | "exited";
type Action = "pause" | "resume" | "snapshot" | "driveResized";
/** Allowed actions per state. */
const ALLOWED: Record<VmState, readonly Action[]> = {
  running: ["pause", "driveResized"],
  paused: ["resume", "snapshot", "driveResized"],
  exited: [],
};

/** A Firecracker process owned by the driver. */
class FirecrackerVm implements VmHandle {
  readonly id: string;
  readonly pid: number;
  readonly exited: Promise<number | null>;
  /** Guest serial console (Firecracker's stdout) and Firecracker's own messages. */
  readonly consolePath: string;
  readonly startTime: number;
  readonly controlSocket: string;
  #state: VmState;
  #api: FirecrackerApi;
  #proc: VmmProcess;
  #cfg: FirecrackerConfig;
  #cleanup: () => void;
  #stopping: Promise<void> | undefined;

  constructor(
    id: string,
    proc: VmmProcess,
    api: FirecrackerApi,
    cfg: FirecrackerConfig,
    state: VmState,
    consolePath: string,
    cleanup: () => void,
    /** Started from a snapshot (its RAM is a private mapping of a memory image). */
    readonly restored = false,
    /** Sparse file every Diff snapshot of this VM merges its dirty pages into (see the module comment). */
    readonly dirtyMemPath = "",
    /** The process's start time and API socket, as its record has them. */
    rec: { startTime: number; controlSocket: string } = { startTime: 0, controlSocket: "" },
  ) {
    this.startTime = rec.startTime;
    this.controlSocket = rec.controlSocket;
    this.id = id;
    this.consolePath = consolePath;
    this.pid = proc.pid;
    this.#proc = proc;
    this.#api = api;
    this.#cfg = cfg;
    this.#state = state;
    this.#cleanup = cleanup;
    this.exited = proc.exited.then((code) => {
      const unexpected = this.#stopping === undefined;
      this.#state = "exited";
      if (unexpected) log.error({ id, pid: proc.pid, exitCode: code }, "firecracker exited unexpectedly");
      this.#cleanup();
      return code;
    });
  }

  /** Current state as the driver tracks it. */
  get state(): VmState {
    return this.#state;
  }

  get paused(): boolean {
    return this.#state === "paused";
  }

  #require(action: Action): void {
    if (!ALLOWED[this.#state].includes(action)) {
      throw new VmmError("vmm.bad_state", `vm ${this.id}: cannot ${action} while ${this.#state}`, { id: this.id, action, state: this.#state });
    }
  }

  async pause(): Promise<void> {
    this.#require("pause");
    await this.#api.send(vmStateRequest("Paused"));
    this.#state = "paused";
  }

  async resume(): Promise<void> {
    this.#require("resume");
    await this.#api.send(vmStateRequest("Resumed"));
    this.#state = "running";
  }

  /** `VmHandle.driveResized`: PATCH /drives/{id} with the same path (Firecracker re-reads its size). */
  async driveResized(drive: Pick<DriveSpec, "id" | "path">, _bytes: number): Promise<void> {
    this.#require("driveResized");
    await this.#api.send(patchDriveRequest(drive));
  }

  /** Write a Firecracker snapshot (Full or Diff per `files.kind`) of the paused VM. */
  async snapshot(files: SnapshotFiles): Promise<void> {
    this.#require("snapshot");
    await this.#api.send(snapshotCreateRequest(files));
  }

  /**
   * `VmHandle.captureSnapshot` of the paused VM:
   * - restored with dirty-page tracking: a Diff snapshot merged into `dirtyMemPath`; the capture
   *   is its data extents (every page changed since the load, page-aligned) read from that file;
   * - booted, or restored without tracking: a Full snapshot whose memory file (`<statePath>.mem`,
   *   removed by `release()`) is the whole guest RAM; a restored VM's is compared with the memory
   *   image it was restored from (`overParent`).
   * @throws VmmError `vmm.bad_state` (not paused), `vmm.firecracker_api`, `vmm.snapshot_failed`
   *   (the dirty-page file unreadable)
   */
  async captureSnapshot(statePath: string): Promise<MemoryCapture> {
    if (!this.restored || !this.#cfg.trackDirtyPages || !this.dirtyMemPath) {
      const memPath = `${statePath}.mem`;
      await this.snapshot({ statePath, memPath, kind: "full" });
      return { kind: "file", path: memPath, overParent: this.restored, release: () => rmSync(memPath, { force: true }) };
    }
    await this.snapshot({ statePath, memPath: this.dirtyMemPath, kind: "diff" });
    let fd: number;
    let ranges: Array<[number, number]>;
    try {
      fd = openSync(this.dirtyMemPath, "r");
    } catch (e) {
      throw new VmmError("vmm.snapshot_failed", `vm ${this.id}: diff memory file ${this.dirtyMemPath} unreadable: ${errorMessage(e)}`, { id: this.id, path: this.dirtyMemPath }, { cause: e });
    }
    try {
      ranges = pageRanges(dataExtents(fd, fstatSync(fd).size));
    } catch (e) {
      closeSync(fd);
      throw new VmmError("vmm.snapshot_failed", `vm ${this.id}: extents of ${this.dirtyMemPath}: ${errorMessage(e)}`, { id: this.id, path: this.dirtyMemPath }, { cause: e });
    }
    const f = fd;
    return { kind: "changed", ranges, read: (buf, offset) => preadAll(f, buf, offset, this.dirtyMemPath), release: () => closeSync(f) };
  }

  /** SIGTERM, then SIGKILL after `stop_timeout_ms`; removes the socket and the record. */
  stop(): Promise<void> {
    this.#stopping ??= (async () => {
      if (this.#proc.running) {
        this.#proc.kill("SIGTERM");
        const t = setTimeout(() => this.#proc.kill("SIGKILL"), this.#cfg.stopTimeoutMs);
        await this.exited;
        clearTimeout(t);
      } else {
        await this.exited;
      }
    })();
    return this.#stopping;
  }

  /** `VmHandle.detach`: the process, its socket and its record stay for the next node. */
  detach(): void {
    // a stop() from now on does nothing: the VMM is the next node's
    this.#stopping ??= Promise.resolve();
    this.#proc.release();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** Page size of guest memory in snapshot files (x86_64, no huge pages). */
const PAGE = 4096;

/** Byte extents widened to whole pages and merged (sorted, non-overlapping [start, end)). */
export function pageRanges(extents: ReadonlyArray<readonly [number, number]>): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (const [a, b] of extents) {
    const s = Math.floor(a / PAGE) * PAGE;
    const e = Math.ceil(b / PAGE) * PAGE;
    const last = out[out.length - 1];
    if (last && s <= last[1]) last[1] = Math.max(last[1], e);
    else out.push([s, e]);
  }
  return out;
}

/** Fill `buf` from `fd` at `offset`; bytes past the end of the file read as zeros. */
function preadAll(fd: number, buf: Uint8Array, offset: number, path: string): void {
  let done = 0;
  while (done < buf.length) {
    const n = readSync(fd, buf, done, buf.length - done, offset + done);
    if (n === 0) break;
    done += n;
  }
  if (done < buf.length) {
    buf.fill(0, done);
    log.warn({ path, offset, short: buf.length - done }, "diff memory file shorter than guest RAM");
  }
}

/** Options of the driver. */
export interface FirecrackerDriverOptions {
  config: FirecrackerConfig;
  /** Where VMM records go for crash reaping (`<runtime_path>`; see ../supervise.ts). */
  runtimeDir: string;
}

/** The Firecracker implementation of VmmDriver. */
export class FirecrackerDriver implements VmmDriver {
  readonly name = "firecracker" as const;
  /** `VmmDriver.machineKey`: the configured base command line (the devices are the spec's). */
  readonly machineKey: string;
  readonly #cfg: FirecrackerConfig;
  readonly #runtimeDir: string;

  constructor(opts: FirecrackerDriverOptions) {
    this.#cfg = opts.config;
    this.#runtimeDir = opts.runtimeDir;
    this.machineKey = new Bun.CryptoHasher("sha256").update(`firecracker\0${opts.config.bootArgs}`).digest("hex").slice(0, 16);
  }

  /**
   * Spawn Firecracker, configure machine, kernel, drives, NIC and MMDS, then InstanceStart.
   * @throws VmmError `vmm.bad_spec`, `vmm.spawn_failed`, `vmm.firecracker_api` (with Firecracker's
   *   fault_message), `vmm.firecracker_unreachable`; the process is stopped on any failure.
   */
  async boot(spec: VmSpec): Promise<FirecrackerVm> {
    const reqs = bootRequests(spec, this.#cfg);
    return this.#start(spec, reqs, "running");
  }

  /**
   * Spawn a fresh Firecracker and load `files` (memory from a File backend, mapped privately);
   * the VM is paused unless `opts.resume`. MMDS data is PUT again after the load.
   */
  async restore(spec: VmSpec, files: SnapshotFiles, opts: { resume: boolean }): Promise<FirecrackerVm> {
    const reqs = restoreRequests(spec, files, opts.resume, this.#cfg);
    return this.#start(spec, reqs, opts.resume ? "running" : "paused", true);
  }

  async #start(spec: VmSpec, reqs: ApiRequest[], state: VmState, restored = false): Promise<FirecrackerVm> {
    validateSpec(spec);
    mkdirSync(spec.workDir, { recursive: true });
    const sock = join(spec.workDir, "firecracker.sock");
    rmSync(sock, { force: true }); // Firecracker refuses to bind over an existing socket
    const cmd = [this.#cfg.binary, "--api-sock", sock, "--id", spec.id];
    if (spec.net) cmd.unshift("nsenter", `--net=${spec.net.netnsPath}`, "--");
    const logFd = openSync(join(spec.workDir, "firecracker.log"), "a");
    let proc: ReturnType<typeof Bun.spawn>;
    try {
      // own session (setsid before exec; nsenter execs Firecracker, same pid): Ctrl-C on the
      // node's terminal does not reach the VMM before the node's shutdown handles it
      proc = Bun.spawn(cmd, { cwd: spec.workDir, stdin: "ignore", stdout: logFd, stderr: logFd, detached: true });
    } catch (e) {
      throw new VmmError("vmm.spawn_failed", `vm ${spec.id}: cannot start ${this.#cfg.binary}: ${errorMessage(e)}`, { id: spec.id, binary: this.#cfg.binary }, { cause: e });
    } finally {
      closeSync(logFd);
    }
    // the Diff snapshots of a restored VM accumulate here; a file left by an earlier VM of this id must not be merged into
    const dirtyMemPath = restored ? join(spec.workDir, DIRTY_MEM_FILE) : "";
    if (dirtyMemPath) rmSync(dirtyMemPath, { force: true });
    const owned = dirtyMemPath ? [sock, dirtyMemPath] : [sock];
    const record = { id: spec.id, ownedFiles: owned };
    const consolePath = join(spec.workDir, "firecracker.log");
    const startTime = processStartTime(proc.pid) ?? 0;
    writeRecord(this.#runtimeDir, {
      id: spec.id, driver: "firecracker", pid: proc.pid, startTime, ownedFiles: owned,
      argv: spec.net ? cmd.slice(3) : cmd, workDir: spec.workDir, controlSocket: sock, consolePath, restored, dirtyMemPath,
    });
    const api = new FirecrackerApi(sock, spec.id, this.#cfg.apiTimeoutMs);
    const vm = new FirecrackerVm(spec.id, bunVmm(proc), api, this.#cfg, state, consolePath, () => removeRecord(this.#runtimeDir, record), restored, dirtyMemPath, { startTime, controlSocket: sock });
    try {
      await this.#waitApi(api, proc, spec.id);
      for (const r of reqs) await api.send(r);
    } catch (e) {
      await vm.stop();
      throw e;
    }
    log.info({ id: spec.id, pid: proc.pid, state }, "firecracker vm started");
    return vm;
  }

  /**
   * Take over the Firecracker a previous node started, from its record: prove the process is
   * that VMM (../adopt.ts: its arguments name the API socket and the sandbox id), ask `GET /`
   * for the instance state (../shared/contracts/firecracker-api.yaml `InstanceInfo.state`):
   * "Running" and "Paused" are adopted, anything else ("Not started": a boot or a snapshot load
   * cut halfway) and a VMM whose API does not answer are killed and reported lost. The console
   * is the file Firecracker writes (`firecracker.log`), nothing to reconnect.
   * @returns `attached` with a handle like `boot`'s (`exited` resolves null), or `lost`
   */
  async attach(rec: VmmRecord, _opts: AttachOptions = {}): Promise<VmmAttachResult> {
    const held = await holdRecorded(rec, "firecracker", ["argv", "workDir", "controlSocket", "consolePath", "restored", "dirtyMemPath"], this.#cfg.stopTimeoutMs);
    if (!("proc" in held)) return held;
    const api = new FirecrackerApi(rec.controlSocket!, rec.id, this.#cfg.apiTimeoutMs);
    let info: { id?: string; state?: string };
    try {
      info = ((await api.send({ method: "GET", path: "/" })) ?? {}) as { id?: string; state?: string };
    } catch (e) {
      const gone = held.proc.gone;
      await killHeld(held.proc, this.#cfg.stopTimeoutMs);
      removeRecord(this.#runtimeDir, rec);
      return lost(rec.id, gone ? "gone" : "unresponsive", `firecracker ${rec.pid}: ${errorMessage(e)}`);
    }
    const state: VmState | undefined = info.state === "Running" ? "running" : info.state === "Paused" ? "paused" : undefined;
    if (info.id !== rec.id || !state) {
      await killHeld(held.proc, this.#cfg.stopTimeoutMs);
      removeRecord(this.#runtimeDir, rec);
      return info.id !== rec.id
        ? lost(rec.id, "record_invalid", `API socket ${rec.controlSocket} answers as instance ${JSON.stringify(info.id)}`)
        : lost(rec.id, "bad_state", `instance state ${JSON.stringify(info.state)}`);
    }
    const vm = new FirecrackerVm(rec.id, heldVmm(held.proc), api, this.#cfg, state, rec.consolePath!, () => removeRecord(this.#runtimeDir, rec), rec.restored!, rec.dirtyMemPath!, { startTime: rec.startTime, controlSocket: rec.controlSocket! });
    log.info({ id: rec.id, pid: rec.pid, state }, "firecracker adopted");
    return { kind: "attached", vm };
  }

  /**
   * Wait until the API answers `GET /` (the socket file appears at bind(), before listen(), so
   * its existence alone is not enough), the process exits, or `socketTimeoutMs` passes.
   */
  async #waitApi(api: FirecrackerApi, proc: ReturnType<typeof Bun.spawn>, id: string): Promise<void> {
    const unreachable = (e: unknown) => e instanceof VmmError && e.code === "vmm.firecracker_unreachable";
    try {
      await retryUntil(
        async () => {
          if (proc.exitCode !== null || proc.signalCode !== null) {
            throw new VmmError("vmm.spawn_failed", `vm ${id}: firecracker exited (${proc.exitCode ?? proc.signalCode}) before its API answered`, {
              id, exitCode: proc.exitCode, signal: proc.signalCode, binary: this.#cfg.binary,
            });
          }
          if (!existsSync(api.socketPath)) throw new VmmError("vmm.firecracker_unreachable", `API socket ${api.socketPath} not there yet`, { socket: api.socketPath });
          await api.send({ method: "GET", path: "/" });
        },
        { timeoutMs: this.#cfg.socketTimeoutMs, intervalMs: 5, retryable: unreachable },
      );
    } catch (e) {
      if (!unreachable(e)) throw e;
      throw new VmmError("vmm.spawn_failed", `vm ${id}: API socket ${api.socketPath} not answering after ${this.#cfg.socketTimeoutMs} ms`, { id, socket: api.socketPath });
    }
  }
}
