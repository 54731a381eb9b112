/**
 * envd's HTTP server: plain routes (/health, /init, /envs, /metrics, /files) and the Connect
 * services `process.Process` and `filesystem.Filesystem` (JSON and binary protobuf, unary and
 * server streaming) on one Bun.serve port.
 */
import type { Server } from "bun";
import { createConnectRouter } from "@connectrpc/connect";
import { createFetchHandler } from "@connectrpc/connect/protocol";
import { logger } from "./log.ts";
import { hasValidToken } from "./auth.ts";
import { EnvdError } from "./errors.ts";
import { filesystemService } from "./filesystem/service.ts";
import { Filesystem } from "./gen/filesystem_pb.ts";
import { Process } from "./gen/process_pb.ts";
import { composeFiles, parseComposeBody } from "./http/compose.ts";
import { downloadFile, uploadFiles } from "./http/files.ts";
import { handleInit } from "./http/init.ts";
import { collectMetrics } from "./http/metrics.ts";
import { CpuMeter } from "../ffi/cpu.ts";
import { ProcessManager } from "./process/manager.ts";
import { processService, processStreams } from "./process/service.ts";
import { EnvdState } from "./state.ts";
import { ENVD_PORT, ENVD_VERSION } from "./version.ts";
import { errorMessage } from "../util/error.ts";

const log = logger("envd");

/** Everything envd can be told at start; defaults in config/default.toml `[envd]`. */
export interface EnvdOptions {
  /** TCP port (49983 in the guest; 0 = any free port). */
  port: number;
  /** Bind address. */
  host: string;
  /** Acting user before /init sets one. */
  defaultUser: string;
  /** Access token at start (normally installed later by /init). */
  accessToken?: string;
  /** Set the system clock from /init's timestamp (guests only). */
  clockSync: boolean;
  defaultKeepaliveS: number;
  maxProcesses: number;
  exitedRetentionMs: number;
  /** After SIGKILL, the longest wait for the process to be reaped before SendSignal answers, ms. */
  killWaitMs: number;
  outputDrainMs: number;
  queueHighWater: number;
  /** Output bytes buffered per process stream before the process's pipe is no longer read. */
  queueHighWaterBytes: number;
  /** Output kept per process while no stream is attached, for the next Connect (newest bytes), bytes; 0 = dropped. */
  detachedOutputBytes: number;
  /** Largest output payload of one data event, bytes (≤ 65536). */
  maxEventBytes: number;
  /** Capacity asked for each process's stdout/stderr pipe, bytes. */
  pipeBytes: number;
  /** Most output bytes sent to a client in one body chunk (several whole events). */
  batchBytes: number;
  /** Encoded output bytes between synchronous garbage collections; 0 = never. */
  gcEveryBytes: number;
  /** Largest request message of a streaming RPC (Start/Connect), bytes. */
  maxStreamRequestBytes: number;
  maxListEntries: number;
  maxWatchers: number;
  maxWatcherEvents: number;
  /** Most directories one recursive watch follows. */
  maxWatchDirs: number;
  /** HTTP idle timeout, s (Bun caps it at 255). */
  idleTimeoutS: number;
  /** Largest request body (uploads), bytes; bodies are streamed to disk, never held whole. */
  maxRequestBodyBytes: number;
  /** Most source files one /files/compose takes. */
  maxComposeSources: number;
  /** Check the acting user's rights on file operations (off = E2B behaviour, see EnvdState). */
  enforcePermissions: boolean;
  /** Mix /init's entropy into the kernel random generator and reseed it (guests only). */
  reseedRandom: boolean;
  /** Directory /init's caBundle is written to. */
  caDir: string;
  /** System CA bundle /init's caBundle is put into; "" = none. */
  caBundlePath: string;
  /** Command run after writing a CA bundle; empty = none. */
  caUpdateCommand: string;
}

/** Defaults matching config/default.toml `[envd]`, for tests and embedding. */
export const DEFAULT_ENVD_OPTIONS: EnvdOptions = {
  port: ENVD_PORT,
  host: "0.0.0.0",
  defaultUser: "root",
  clockSync: false,
  defaultKeepaliveS: 90,
  maxProcesses: 1024,
  exitedRetentionMs: 30_000,
  killWaitMs: 5000,
  outputDrainMs: 100,
  queueHighWater: 256,
  queueHighWaterBytes: 1024 * 1024,
  detachedOutputBytes: 256 * 1024,
  maxEventBytes: 32 * 1024,
  pipeBytes: 1024 * 1024,
  batchBytes: 256 * 1024,
  gcEveryBytes: 64 * 1024 * 1024,
  maxStreamRequestBytes: 4 * 1024 * 1024,
  maxListEntries: 100_000,
  maxWatchers: 256,
  maxWatcherEvents: 10_000,
  maxWatchDirs: 8192,
  idleTimeoutS: 255,
  maxRequestBodyBytes: 1024 ** 4,
  maxComposeSources: 10_000,
  enforcePermissions: false,
  reseedRandom: false,
  caDir: "/usr/local/share/ca-certificates",
  caBundlePath: "",
  caUpdateCommand: "",
};

/** A running envd. */
export interface Envd {
  readonly port: number;
  readonly url: string;
  readonly state: EnvdState;
  /** Stop listening, kill remaining processes, close watchers. */
  stop(): Promise<void>;
}

const CORS = {
  "Access-Control-Allow-Origin": "*",
  "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, OPTIONS",
  "Access-Control-Allow-Headers": "*",
  "Access-Control-Expose-Headers": "Connect-Protocol-Version, Connect-Timeout-Ms, Grpc-Status, Grpc-Message, X-Envd-Version",
  "Access-Control-Max-Age": "7200",
};

function json(body: unknown, status = 200, extra: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", ...extra } });
}

function httpError(err: unknown): Response {
  if (err instanceof EnvdError) {
    if (err.httpStatus >= 500) log.error({ err, code: err.code, details: err.details }, err.message);
    return json({ code: err.httpStatus, message: err.message }, err.httpStatus);
  }
  log.error({ err }, "unhandled error");
  return json({ code: 500, message: errorMessage(err) }, 500);
}

function withCors(res: Response): Response {
  for (const [k, v] of Object.entries(CORS)) if (!res.headers.has(k)) res.headers.set(k, v);
  return res;
}

function resolveBin(name: string): string {
  return Bun.which(name, { PATH: "/usr/bin:/bin:/usr/sbin:/sbin:" + (process.env.PATH ?? "") }) ?? `/usr/bin/${name}`;
}

/**
 * Start envd.
 * @throws when the port cannot be bound.
 */
export function startEnvd(partial: Partial<EnvdOptions> = {}): Envd {
  const opts = { ...DEFAULT_ENVD_OPTIONS, ...partial };
  if (!Number.isInteger(opts.maxEventBytes) || opts.maxEventBytes < 1 || opts.maxEventBytes > 65536) {
    throw new EnvdError("invalid_argument", `output event size ${opts.maxEventBytes} not in 1..65536 bytes`, { maxEventBytes: opts.maxEventBytes });
  }
  const state = new EnvdState({ defaultUser: opts.defaultUser, accessToken: opts.accessToken, enforcePermissions: opts.enforcePermissions });
  const manager = new ProcessManager({
    maxProcesses: opts.maxProcesses,
    exitedRetentionMs: opts.exitedRetentionMs,
    killWaitMs: opts.killWaitMs,
    outputDrainMs: opts.outputDrainMs,
    queueHighWater: opts.queueHighWater,
    queueHighWaterBytes: opts.queueHighWaterBytes,
    detachedOutputBytes: opts.detachedOutputBytes,
    pipeBytes: opts.pipeBytes,
    setsidPath: resolveBin("setsid"),
    catPath: resolveBin("cat"),
    setprivPath: Bun.which("setpriv", { PATH: "/usr/bin:/bin:/usr/sbin:/sbin" }) ?? undefined,
  });
  const fsService = filesystemService(state, {
    defaultKeepaliveS: opts.defaultKeepaliveS,
    maxListEntries: opts.maxListEntries,
    maxWatchers: opts.maxWatchers,
    maxWatcherEvents: opts.maxWatcherEvents,
    queueHighWater: opts.queueHighWater,
    maxWatchDirs: opts.maxWatchDirs,
    catPath: resolveBin("cat"),
  });
  const cpu = new CpuMeter();
  const router = createConnectRouter({ jsonOptions: { ignoreUnknownFields: true } });
  router.service(Process, processService(manager));
  router.service(Filesystem, fsService);
  const rpc = new Map(router.handlers.map((h) => [h.requestPath, createFetchHandler(h)]));
  const streams = processStreams(manager, state, {
    defaultKeepaliveS: opts.defaultKeepaliveS,
    defaultPty: { cols: 80, rows: 24 },
    path: process.env.PATH || "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    batchBytes: opts.batchBytes,
    maxEventBytes: opts.maxEventBytes,
    gcEveryBytes: opts.gcEveryBytes,
    stream: { maxRequestBytes: opts.maxStreamRequestBytes, maxTimeoutMs: Number.MAX_SAFE_INTEGER },
  });

  const route = async (req: Request): Promise<Response> => {
    const url = new URL(req.url);
    const path = url.pathname;
    if (req.method === "OPTIONS") return new Response(null, { status: 204 });
    if (path === "/health" && req.method === "GET") return new Response(null, { status: 204 });
    if (path === "/files") {
      if (req.method === "GET") return downloadFile(state, req, url);
      if (req.method === "POST") return json(await uploadFiles(state, req, url));
      return json({ code: 405, message: "method not allowed" }, 405);
    }
    if (path === "/init" && req.method === "POST") {
      await handleInit(state, req, { syncClock: opts.clockSync, reseedRandom: opts.reseedRandom, ca: { caDir: opts.caDir, bundlePath: opts.caBundlePath, updateCommand: opts.caUpdateCommand } });
      // one line per (re)initialisation: a restored guest's log shows when its envd took over
      log.info({ user: state.defaultUser, envVars: Object.keys(state.envVars).length, token: state.accessToken !== undefined, reseeds: state.reseeds }, "envd initialised");
      return new Response(null, { status: 204, headers: { "X-Envd-Version": ENVD_VERSION, "Cache-Control": "no-store" } });
    }
    if (!hasValidToken(state, req.headers)) return json({ code: 401, message: "invalid access token" }, 401);
    const handler = streams.get(path) ?? rpc.get(path);
    if (handler) return handler(req);
    if (path === "/files/compose" && req.method === "POST") {
      let body: unknown;
      try {
        body = await req.json();
      } catch {
        throw new EnvdError("invalid_argument", "compose body is not valid JSON", {});
      }
      return json(await composeFiles(state, parseComposeBody(body, opts.maxComposeSources)));
    }
    if (path === "/envs" && req.method === "GET") return json(state.envVars);
    if (path === "/metrics" && req.method === "GET") return json(collectMetrics(cpu));
    return json({ code: 404, message: `no route for ${req.method} ${path}` }, 404);
  };

  const server: Server<undefined> = Bun.serve({
    port: opts.port,
    hostname: opts.host,
    idleTimeout: Math.min(255, opts.idleTimeoutS),
    maxRequestBodySize: opts.maxRequestBodyBytes,
    async fetch(req) {
      try {
        return withCors(await route(req));
      } catch (err) {
        return withCors(httpError(err));
      }
    },
  });
  const port = server.port!;
  log.info({ port, host: opts.host, version: ENVD_VERSION }, "envd listening");
  return {
    port,
    url: `http://${opts.host === "0.0.0.0" ? "127.0.0.1" : opts.host}:${port}`,
    state,
    async stop() {
      await server.stop(true);
      fsService.close();
      await manager.shutdown();
    },
  };
}
