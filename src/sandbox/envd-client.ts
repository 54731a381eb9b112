/**
 * The host's side of envd (guest port 49983): `POST /init` (token, env vars, default user, clock;
 * answers 204 with `X-Envd-Version`), metrics, processes and uploads (waiting for `GET /health`:
 * envd-health.ts).
 * Facts: e2b-contract.md §3.2.
 */
import { randomBytes } from "node:crypto";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { Type as T } from "@sinclair/typebox";
import { errorMessage } from "../util/error.ts";
import { describeProblem, jsonSchema } from "../util/json-check.ts";
import { readCapped, textCapped } from "../util/read-capped.ts";
import { connectEnvelope, processStream } from "./connect-frames.ts";

export { connectEnvelope, connectFrames, MAX_CONNECT_FRAME_BYTES } from "./connect-frames.ts";

/** Bytes of an envd error answer read for the error message. */
const ANSWER_TEXT_BYTES = 4096;

/** Host random bytes every /init carries for the guest's kernel generator (docs/security.md). */
export const INIT_ENTROPY_BYTES = 64;

/** Body of envd `/init` (the fields AgentENV sends). */
export interface EnvdInit {
  accessToken?: string;
  envVars: Record<string, string>;
  defaultUser: string;
  defaultWorkdir: string;
  /** RFC 3339; envd sets its clock from it when it is off. */
  timestamp: string;
  /** Guest host name (AgentENV extension; a restored guest keeps the one it had otherwise). */
  hostname?: string;
  /** PEM certificates for the guest's trust store (the node's egress CA). */
  caBundle?: string;
}

/**
 * `POST base/init`. `currentToken` authorises a re-init once a token is installed. Every call
 * adds `entropy`: fresh host random bytes envd reseeds the guest kernel's generator with before it
 * applies the rest, so each restore of a snapshot (create, fork child, resume, pool adoption)
 * leaves /init with a CRNG of its own.
 * @returns the envd version it reports (header `X-Envd-Version`), or null when absent.
 * @throws OrchestratorError `orchestrator.envd_init_failed` for a non-2xx answer or a network error.
 */
export async function initEnvd(base: string, body: EnvdInit, currentToken: string | null, signal: AbortSignal): Promise<string | null> {
  let res: Response;
  try {
    res = await fetch(`${base}/init`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(currentToken ? { "x-access-token": currentToken } : {}) },
      body: JSON.stringify({ ...body, entropy: randomBytes(INIT_ENTROPY_BYTES).toString("base64") }),
      signal,
    });
  } catch (e) {
    throw new OrchestratorError("orchestrator.envd_init_failed", `envd /init at ${base} failed: ${errorMessage(e)}`, { base });
  }
  const text = await textCapped(res, ANSWER_TEXT_BYTES);
  if (!res.ok) throw new OrchestratorError("orchestrator.envd_init_failed", `envd /init at ${base} answered ${res.status}: ${text.slice(0, 200)}`, { base, status: res.status });
  return res.headers.get("x-envd-version");
}

/** A number as JSON carries it (finite: JSON has no NaN or infinity). */
const NUM = T.Number();

/** envd `GET /metrics` body (envd.yaml `Metrics`), the fields the node reads. */
const ENVD_METRICS = jsonSchema(
  T.Object({
    cpu_count: NUM,
    cpu_used_pct: NUM,
    mem_total: NUM,
    mem_used: NUM,
    mem_cache: T.Optional(NUM),
    disk_used: T.Optional(NUM),
    disk_total: T.Optional(NUM),
  }),
);

/** Largest envd `/metrics` answer read, bytes (the body is a handful of numbers). */
const METRICS_BYTES = 64 * 1024;

/**
 * `GET base/metrics`: the guest's view of its vCPUs, CPU use since envd's previous answer (%),
 * memory and root disk (bytes).
 * @throws OrchestratorError `orchestrator.envd_metrics_failed` for a network error, a non-2xx
 *   answer, a body over 64 KiB or one without the numeric fields (details.field names it).
 */
export async function fetchEnvdMetrics(
  base: string,
  token: string | null,
  signal: AbortSignal,
): Promise<{ cpuCount: number; cpuUsedPct: number; memUsed: number; memTotal: number; memCache: number; diskUsed: number; diskTotal: number }> {
  let text: string;
  try {
    const res = await fetch(`${base}/metrics`, { headers: token ? { "x-access-token": token } : {}, signal });
    if (!res.ok) throw new Error(`HTTP ${res.status}: ${(await textCapped(res, ANSWER_TEXT_BYTES)).slice(0, 200)}`);
    const body = await readCapped(res.body, METRICS_BYTES);
    if (body.truncated) throw new Error(`the answer exceeds ${METRICS_BYTES} bytes`);
    text = new TextDecoder().decode(body.bytes);
  } catch (e) {
    throw new OrchestratorError("orchestrator.envd_metrics_failed", `envd /metrics at ${base} failed: ${errorMessage(e)}`, { base });
  }
  const r = ENVD_METRICS.parse(text);
  if (!r.ok) {
    const field = r.problem.path.replace(/^\//, "");
    throw new OrchestratorError("orchestrator.envd_metrics_failed", `envd /metrics at ${base}: ${field ? `${field} is not a number` : describeProblem(r.problem)}`, { base, field });
  }
  const m = r.value;
  return {
    cpuCount: m.cpu_count,
    cpuUsedPct: m.cpu_used_pct,
    memUsed: m.mem_used,
    memTotal: m.mem_total,
    memCache: m.mem_cache ?? 0,
    diskUsed: m.disk_used ?? 0,
    diskTotal: m.disk_total ?? 0,
  };
}

/** What `runInGuest` runs: a program with arguments, as a user, in a directory, with extra env. */
export interface GuestCommand {
  cmd: string;
  args: string[];
  /** Guest user the process runs as (envd's Basic-auth user). */
  user: string;
  cwd?: string;
  envs?: Record<string, string>;
  /** Token for `X-Access-Token` when envd has one. */
  accessToken?: string | null;
}

/** How a guest process ended. `output` is the last `keepBytes` of stdout+stderr interleaved. */
export interface GuestResult {
  exitCode: number;
  output: string;
  pid: number;
}

/**
 * Run a process in the guest through envd's `process.Process/Start` (Connect protocol, JSON
 * codec, server stream) and wait for it to end. Output chunks go to `onData` as they come.
 * `signal` aborts the stream (the process is then left to envd).
 * @returns exit code (-1 when envd reports no exit code), the output tail and the pid.
 * @throws OrchestratorError `orchestrator.envd_failed` when envd refuses the call or the stream breaks.
 */
export async function runInGuest(
  base: string,
  c: GuestCommand,
  signal: AbortSignal,
  onData?: (stream: "stdout" | "stderr", text: string) => void,
  keepBytes = 16_384,
): Promise<GuestResult> {
  const req = { process: { cmd: c.cmd, args: c.args, envs: c.envs ?? {}, ...(c.cwd ? { cwd: c.cwd } : {}) }, stdin: false };
  let res: Response;
  try {
    res = await fetch(`${base}/process.Process/Start`, {
      method: "POST",
      headers: {
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
        authorization: `Basic ${Buffer.from(`${c.user}:`).toString("base64")}`,
        ...(c.accessToken ? { "x-access-token": c.accessToken } : {}),
      },
      body: connectEnvelope(req),
      signal,
    });
  } catch (e) {
    throw new OrchestratorError("orchestrator.envd_failed", `envd process start at ${base} failed: ${errorMessage(e)}`, { base, cmd: c.cmd });
  }
  if (!res.ok || !res.body) {
    const text = await textCapped(res, ANSWER_TEXT_BYTES);
    throw new OrchestratorError("orchestrator.envd_failed", `envd process start answered ${res.status}: ${text.slice(0, 300)}`, { base, status: res.status });
  }
  let output = "";
  let exitCode: number | null = null;
  let pid = 0;
  // one streaming decoder per stream: a character split across two data events is decoded whole
  const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  const take = (stream: "stdout" | "stderr", b64: string) => {
    const text = decoders[stream].decode(Buffer.from(b64, "base64"), { stream: true });
    output = (output + text).slice(-keepBytes);
    onData?.(stream, text);
  };
  let refused: { code: string; message: string } | null = null;
  try {
    for await (const m of processStream(res.body)) {
      if (m.end) {
        refused = m.error;
        break;
      }
      const ev = m.event;
      if (ev.start) pid = ev.start.pid ?? 0;
      if (ev.data?.stdout !== undefined) take("stdout", ev.data.stdout);
      if (ev.data?.stderr !== undefined) take("stderr", ev.data.stderr);
      if (ev.data?.pty !== undefined) take("stdout", ev.data.pty);
      if (ev.end) exitCode = ev.end.exitCode ?? (ev.end.exited ? 0 : -1);
    }
  } catch (e) {
    const details = e instanceof OrchestratorError ? e.details : {};
    throw new OrchestratorError("orchestrator.envd_failed", `envd process stream of ${c.cmd} broke: ${errorMessage(e)}`, { ...details, base, cmd: c.cmd });
  }
  if (refused) throw new OrchestratorError("orchestrator.envd_failed", `envd: ${refused.code}: ${refused.message}`, { base, cmd: c.cmd });
  if (exitCode === null) throw new OrchestratorError("orchestrator.envd_failed", `envd process stream of ${c.cmd} ended without an end event`, { base, cmd: c.cmd });
  return { exitCode, output, pid };
}

/**
 * Write a host file into the guest at `guestPath` (octet-stream `POST /files`, streamed), owned
 * by `user`. @throws OrchestratorError `orchestrator.envd_failed` for a non-2xx answer.
 */
export async function uploadToGuest(base: string, localPath: string, guestPath: string, user: string, signal: AbortSignal, accessToken?: string | null): Promise<void> {
  const url = `${base}/files?path=${encodeURIComponent(guestPath)}&username=${encodeURIComponent(user)}`;
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/octet-stream", ...(accessToken ? { "x-access-token": accessToken } : {}) },
    body: Bun.file(localPath),
    signal,
  }).catch((e) => {
    throw new OrchestratorError("orchestrator.envd_failed", `upload of ${localPath} to the guest failed: ${errorMessage(e)}`, { base, guestPath });
  });
  const text = await textCapped(res, ANSWER_TEXT_BYTES);
  if (!res.ok) throw new OrchestratorError("orchestrator.envd_failed", `envd /files answered ${res.status}: ${text.slice(0, 300)}`, { base, guestPath, status: res.status });
}
