/**
 * Body of `agentenv ublk-daemon`: the node's one long-lived disk daemon. It owns every export of
 * the node (FUSE mounts, and ublk devices where the kernel offers ublk), answers requests
 * on a Unix socket (./protocol.ts), and keeps its devices in SQLite (./store.ts) so that after a
 * crash a restarted daemon serves them again (./manager.ts `recover`).
 *
 * Files in its directory `dir` (default `<runtime_path>/disk`): `daemon.sock`, `daemon.db`,
 * `daemon.lock` (flock: one daemon per directory), default mount points `mnt/<dev_id>/`,
 * `shared/<key>/`, `pool/<id>/`.
 *
 * A device lost while handed out (./manager.ts) is announced to every connection as a
 * `device_lost` event.
 *
 * Signals: SIGTERM/SIGINT stop serving and exit 0 WITHOUT removing devices (the node keeps the
 * FUSE connections; a restarted daemon recovers them). The `shutdown` request removes every
 * device first.
 */
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Socket } from "bun";
import { tryFlockExclusive, type HeldFlock } from "../../ffi/flock.ts";
import { logger } from "../../observability/log.ts";
import type { ExportEngine } from "./engine.ts";
import { DiskError } from "../errors.ts";
import { FuseEngine } from "./fuse-engine.ts";
import { UblkEngine } from "./ublk-engine.ts";
import { ownerTagOf, ublkAvailable, type UblkConfig } from "../ublk/index.ts";
import { DeviceManager, type BlockPoolSettings, type LostDevice } from "./manager.ts";
import { DISK_PROTOCOL_VERSION, encodeFrame, errorResponse, FrameReader, parseRequest, type EngineName, type Request, type Response } from "./protocol.ts";
import { DeviceStore } from "./store.ts";
import pkg from "../../../package.json" with { type: "json" };

const log = logger("disk");

/** Everything the daemon needs (the node passes it as JSON; see `daemonSettings`). */
export interface DaemonSettings {
  /** Directory of the socket, database, lock and default mount points. */
  dir: string;
  /** Engine used when a request names none: "auto" = ublk when /dev/ublk-control exists, else FUSE. */
  export: "auto" | EngineName;
  fuse: { threads: number; maxWrite: number; requestTimeoutSec: number; directIo: boolean; splice: boolean; readAheadKb: number };
  /** `[ublk]`: queues, depth, block sizes, user recovery of ublk devices. */
  ublk: UblkConfig;
  pool: BlockPoolSettings;
  /** Largest request frame, bytes. */
  maxFrameBytes: number;
  /**
   * Longest wait at stop for the requests in flight to be answered and their answers written,
   * ms (the node's request_timeout_ms: no client waits longer for an answer).
   */
  drainTimeoutMs: number;
}

function lostInfo(l: LostDevice): { dev_id: string; engine: EngineName; reason: string; at: number } {
  return { dev_id: l.devId, engine: l.engine, reason: l.reason, at: l.at };
}

/** Paths of a daemon directory. */
export function daemonPaths(dir: string): { socket: string; db: string; lock: string; log: string } {
  return { socket: join(dir, "daemon.sock"), db: join(dir, "daemon.db"), lock: join(dir, "daemon.lock"), log: join(dir, "daemon.log") };
}


interface Conn {
  reader: FrameReader;
  out: Uint8Array[];
}

/**
 * Run the daemon until a `shutdown` request or a signal.
 * @param onReady called once the socket listens (the CLI prints `ready <socket>`)
 * @returns the process exit code
 * @throws DiskError `disk.busy` (another daemon holds the directory's lock), `disk.unsupported`
 *   (the configured engine is not available)
 */
export async function runDaemon(s: DaemonSettings, onReady: (socket: string) => void): Promise<number> {
  mkdirSync(s.dir, { recursive: true });
  const paths = daemonPaths(s.dir);
  const lock: HeldFlock | null = tryFlockExclusive(paths.lock);
  if (!lock) throw new DiskError("disk.busy", `another disk daemon is running on ${s.dir}`, { dir: s.dir });
  // the node kills a daemon that no longer answers by this pid
  writeFileSync(paths.lock, `${process.pid}\n`);
  const engines: Partial<Record<EngineName, ExportEngine>> = {};
  let store: DeviceStore | undefined;
  let manager: DeviceManager | undefined;
  let detached = false;
  // set once the socket listens; devices lost before that are in the `list` answer
  let announce: ((l: LostDevice) => void) | null = null;
  try {
    const ublk = ublkAvailable();
    if (s.export === "ublk" && !ublk) throw new DiskError("disk.unsupported", "export = \"ublk\" but /dev/ublk-control does not exist", { export: s.export });
    engines.fuse = new FuseEngine({ threads: s.fuse.threads, maxWrite: s.fuse.maxWrite, requestTimeoutSec: s.fuse.requestTimeoutSec, splice: s.fuse.splice, readAheadKb: s.fuse.readAheadKb });
    if (ublk) engines.ublk = UblkEngine.open(s.ublk, ownerTagOf(s.dir));
    const defaultEngine: EngineName = s.export === "fuse" || !ublk ? "fuse" : "ublk";
    store = new DeviceStore(paths.db);
    manager = new DeviceManager({ store, engines, defaultEngine, dir: s.dir, directIo: s.fuse.directIo, pool: s.pool, onLost: (l) => announce?.(l) });
    await manager.recover();
    await manager.prefill().catch((e) => log.warn({ err: e }, "warm pool prefill failed"));

    let stop!: (why: string) => void;
    const stopped = new Promise<string>((r) => (stop = r));
    let shuttingDown = false;
    const m = manager;
    const features = (): Response => ({
      kind: "features", version: pkg.version, protocol: DISK_PROTOCOL_VERSION, pid: process.pid, engines: m.engines, default_engine: defaultEngine, ublk_control: ublk,
      max_frame_bytes: s.maxFrameBytes, fuse_threads: s.fuse.threads, restarts_recovered: m.recovered,
      pooled: Object.fromEntries(m.engines.map((e) => [e, m.pooled(e)])),
    });

    const handle = async (req: Request): Promise<Response> => {
      const seq = req.seq === undefined ? {} : { seq: req.seq };
      if (shuttingDown && req.kind !== "get_features") throw new DiskError("disk.busy", "the daemon is shutting down", {});
      switch (req.kind) {
        case "get_features":
          return { ...features(), ...seq };
        case "create_runtime_device":
          return { kind: "runtime_device_created", ...seq, ...(await m.create(req)) };
        case "delete":
          await m.delete(req.dev_id);
          return { kind: "deleted", ...seq, dev_id: req.dev_id };
        case "restack_snapshot": {
          const r = await m.restack(req.dev_id, req.output_layer_path, req.next_upper);
          return { kind: "restack_snapshot_created", ...seq, dev_id: req.dev_id, layer_path: r.layerPath, stats: { layers: r.layers, ms: r.ms } };
        }
        case "acquire":
          return { kind: "device_acquired", ...seq, ...(await m.acquire(req)) };
        case "release":
          return { kind: "released", ...seq, dev_id: req.dev_id, ...(await m.release(req.dev_id)) };
        case "update_size":
          return { kind: "size_updated", ...seq, dev_id: req.dev_id, size: await m.updateSize(req.dev_id, req.new_size) };
        case "hold":
          m.hold(req.dev_id, req.holder_pid, req.holder_fd);
          return { kind: "ok", ...seq };
        case "list":
          return { kind: "devices", ...seq, devices: m.list(), lost: m.lost().map(lostInfo) };
        case "stats":
          return { kind: "device_stats", ...seq, dev_id: req.dev_id, stats: m.stats(req.dev_id) };
        case "shutdown":
          shuttingDown = true;
          await m.shutdown();
          stop("shutdown");
          return { kind: "ok", ...seq };
      }
    };

    // requests taken and not yet answered, and connections with answer bytes not yet written:
    // the socket closes only when both are done (see the end of the run)
    const conns = new Set<Socket<Conn>>();
    let inflight = 0;
    let onSettled: (() => void) | undefined;
    const settle = (): void => {
      if (onSettled && inflight === 0 && [...conns].every((c) => c.data.out.length === 0)) onSettled();
    };

    const flush = (sock: Socket<Conn>): void => {
      const q = sock.data.out;
      while (q.length > 0) {
        const chunk = q[0]!;
        const n = sock.write(chunk);
        if (n < chunk.byteLength) {
          q[0] = chunk.subarray(Math.max(0, n));
          return;
        }
        q.shift();
      }
      settle();
    };
    const send = (sock: Socket<Conn>, msg: Response): void => {
      sock.data.out.push(encodeFrame(msg));
      flush(sock);
    };

    rmSync(paths.socket, { force: true });
    const server = Bun.listen<Conn>({
      unix: paths.socket,
      socket: {
        open(sock) {
          sock.data = { reader: new FrameReader(s.maxFrameBytes), out: [] };
          conns.add(sock);
        },
        close(sock) {
          conns.delete(sock);
          settle();
        },
        data(sock, chunk) {
          for (const f of sock.data.reader.push(chunk)) {
            if (!f.ok) {
              send(sock, errorResponse(f.error, undefined, true));
              if (f.fatal) sock.end();
              continue;
            }
            const seqv = f.value.seq;
            const seq = typeof seqv === "number" && Number.isSafeInteger(seqv) && seqv >= 0 ? seqv : undefined;
            let req: Request;
            try {
              req = parseRequest(f.value);
            } catch (e) {
              send(sock, errorResponse(e, seq, true));
              continue;
            }
            inflight++;
            handle(req)
              .then(
                (r) => send(sock, r),
                (e) => {
                  if (!(e instanceof DiskError)) log.error({ err: e, kind: req.kind }, "request failed");
                  send(sock, errorResponse(e, seq, false));
                },
              )
              .finally(() => {
                inflight--;
                settle();
              });
          }
        },
        drain(sock) {
          flush(sock);
        },
        error(_sock, e) {
          log.warn({ err: e }, "control connection error");
        },
      },
    });
    announce = (l) => {
      for (const c of conns) send(c, { kind: "device_lost", ...lostInfo(l) });
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
    log.info({ dir: s.dir, pid: process.pid, devices: m.list().length, engines: m.engines }, "disk daemon ready");
    onReady(paths.socket);
    const why = await stopped;
    log.info({ why }, "disk daemon stopping");
    // no new connections, and no new work on the open ones (answered disk.busy)
    server.stop(false);
    shuttingDown = true;
    if (why !== "shutdown") {
      detached = true;
      await m.detachAll();
    }
    // the answers to every request taken (the shutdown's own "ok" among them) are written before
    // the connections close
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        log.warn({ inflight, unsent: [...conns].filter((c) => c.data.out.length > 0).length, timeoutMs: s.drainTimeoutMs }, "closing with answers not sent");
        resolve();
      }, s.drainTimeoutMs);
      onSettled = () => {
        clearTimeout(timer);
        resolve();
      };
      settle();
    });
    server.stop(true);
    rmSync(paths.socket, { force: true });
    return 0;
  } finally {
    for (const e of Object.values(engines)) await e?.close({ detached }).catch((err) => log.warn({ err, engine: e.name }, "engine close failed"));
    store?.close();
    lock.release();
  }
}
