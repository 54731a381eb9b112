/**
 * The host's side of envd (guest port 49983): wait for `GET /health` (204) and `POST /init`
 * (token, env vars, default user, clock; answers 204 with `X-Envd-Version`).
 * Facts: e2b-contract.md §3.2.
 */
import { OrchestratorError } from "../orchestrator/errors.ts";

/** Body of envd `/init` (the fields AgentENV sends). */
export interface EnvdInit {
  accessToken?: string;
  envVars: Record<string, string>;
  defaultUser: string;
  defaultWorkdir: string;
  /** RFC 3339; envd sets its clock from it when it is off. */
  timestamp: string;
}

/**
 * Poll `base/health` every `pollMs` until it answers 2xx.
 * @throws OrchestratorError `orchestrator.envd_unready` when `signal` aborts or `gone` resolves first
 *   (the VM died), carrying the last error seen.
 */
export async function waitEnvdHealthy(base: string, pollMs: number, signal: AbortSignal, gone?: Promise<unknown>): Promise<void> {
  let dead = false;
  void gone?.then(() => (dead = true));
  let last = "no answer yet";
  for (;;) {
    if (dead) throw new OrchestratorError("orchestrator.envd_unready", `the sandbox VM exited before envd answered (${last})`, { base });
    if (signal.aborted) throw new OrchestratorError("orchestrator.envd_unready", `envd at ${base} not ready in time (${last})`, { base });
    try {
      const res = await fetch(`${base}/health`, { signal: AbortSignal.any([signal, AbortSignal.timeout(Math.max(pollMs * 10, 500))]) });
      await res.arrayBuffer();
      if (res.ok) return;
      last = `HTTP ${res.status}`;
    } catch (e) {
      last = (e as Error).message;
    }
    await Bun.sleep(pollMs);
  }
}

/**
 * `POST base/init`. `currentToken` authorises a re-init once a token is installed.
 * @returns the envd version it reports (header `X-Envd-Version`), or null when absent.
 * @throws OrchestratorError `orchestrator.envd_init_failed` for a non-2xx answer or a network error.
 */
export async function initEnvd(base: string, body: EnvdInit, currentToken: string | null, signal: AbortSignal): Promise<string | null> {
  let res: Response;
  try {
    res = await fetch(`${base}/init`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(currentToken ? { "x-access-token": currentToken } : {}) },
      body: JSON.stringify(body),
      signal,
    });
  } catch (e) {
    throw new OrchestratorError("orchestrator.envd_init_failed", `envd /init at ${base} failed: ${(e as Error).message}`, { base });
  }
  const text = await res.text();
  if (!res.ok) throw new OrchestratorError("orchestrator.envd_init_failed", `envd /init at ${base} answered ${res.status}: ${text.slice(0, 200)}`, { base, status: res.status });
  return res.headers.get("x-envd-version");
}

/** envd `GET /metrics` body (envd.yaml `Metrics`), the fields the node reads. */
interface EnvdMetricsBody {
  cpu_count: number;
  cpu_used_pct: number;
  mem_total: number;
  mem_used: number;
  mem_cache?: number;
  disk_used?: number;
  disk_total?: number;
}

/**
 * `GET base/metrics`: the guest's view of its vCPUs, CPU use since envd's previous answer (%),
 * memory and root disk (bytes).
 * @throws OrchestratorError `orchestrator.envd_metrics_failed` for a network error, a non-2xx
 *   answer or a body without the numeric fields.
 */
export async function fetchEnvdMetrics(
  base: string,
  token: string | null,
  signal: AbortSignal,
): Promise<{ cpuCount: number; cpuUsedPct: number; memUsed: number; memTotal: number; memCache: number; diskUsed: number; diskTotal: number }> {
  let body: EnvdMetricsBody;
  try {
    const res = await fetch(`${base}/metrics`, { headers: token ? { "x-access-token": token } : {}, signal });
    if (!res.ok) {
      const text = await res.text();
      throw new Error(`HTTP ${res.status}: ${text.slice(0, 200)}`);
    }
    body = (await res.json()) as EnvdMetricsBody;
  } catch (e) {
    throw new OrchestratorError("orchestrator.envd_metrics_failed", `envd /metrics at ${base} failed: ${(e as Error).message}`, { base });
  }
  const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : NaN);
  const out = {
    cpuCount: num(body.cpu_count),
    cpuUsedPct: num(body.cpu_used_pct),
    memUsed: num(body.mem_used),
    memTotal: num(body.mem_total),
    memCache: num(body.mem_cache ?? 0),
    diskUsed: num(body.disk_used ?? 0),
    diskTotal: num(body.disk_total ?? 0),
  };
  const bad = Object.entries(out).find(([, v]) => Number.isNaN(v));
  if (bad) throw new OrchestratorError("orchestrator.envd_metrics_failed", `envd /metrics at ${base}: ${bad[0]} is not a number`, { base, field: bad[0] });
  return out;
}
