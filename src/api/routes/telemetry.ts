/**
 * Sandbox metrics and logs routes (E2B `GET /sandboxes/{id}/metrics`, `GET /sandboxes/metrics`,
 * `GET /sandboxes/{id}/logs`, `GET /v2/sandboxes/{id}/logs`; ../shared/contracts/e2b/openapi.yml).
 * Query strings are checked here; the orchestrator answers with plain samples and entries.
 */
import { Elysia, t } from "elysia";
import type { SandboxService, SandboxLogEntry, SandboxMetricsSample } from "../../orchestrator/index.ts";
import { LOG_LEVELS, type LogLevel } from "../../orchestrator/index.ts";
import { ApiError } from "../errors.ts";
import * as S from "../schemas.ts";

/** Most ids one `GET /sandboxes/metrics` may name (E2B's `maxItems`). */
export const MAX_METRICS_IDS = 100;
/** Most entries one logs request returns (E2B's `limit` maximum). */
export const MAX_LOG_LIMIT = 1000;
/** Longest `search` string (E2B's `maxLength`). */
export const MAX_LOG_SEARCH = 256;

const ERR = { 400: S.ErrorBody, 401: S.ErrorBody, 404: S.ErrorBody, 500: S.ErrorBody };
const Digits = (description: string) => t.Optional(t.String({ pattern: "^[0-9]{1,16}$", description }));

/** `SandboxMetric` body. */
export function toMetric(s: SandboxMetricsSample) {
  return {
    timestamp: new Date(s.at).toISOString(),
    timestampUnix: Math.floor(s.at / 1000),
    cpuCount: s.cpuCount,
    cpuUsedPct: s.cpuUsedPct,
    memUsed: s.memUsed,
    memTotal: s.memTotal,
    memCache: s.memCache,
    diskUsed: s.diskUsed,
    diskTotal: s.diskTotal,
  };
}

/** `SandboxLogEntry` body; `fields.source` says where the line came from (lifecycle, console, envd). */
export function toLogEntry(e: SandboxLogEntry) {
  return { timestamp: new Date(e.at).toISOString(), level: e.level, message: e.message, fields: { ...e.fields, source: e.source } };
}

function int(v: string | undefined): number | undefined {
  return v === undefined ? undefined : Number(v);
}

/**
 * Parse `sandbox_ids` (comma-separated, duplicates ignored).
 * @throws ApiError `api.bad_sandbox_ids` (400) when empty or naming more than 100 ids.
 */
export function parseSandboxIds(raw: string): string[] {
  const ids = [...new Set(raw.split(",").map((s) => s.trim()).filter(Boolean))];
  if (ids.length === 0) throw new ApiError("api.bad_sandbox_ids", "sandbox_ids must name at least one sandbox id", { sandbox_ids: raw });
  if (ids.length > MAX_METRICS_IDS) throw new ApiError("api.bad_sandbox_ids", `sandbox_ids names ${ids.length} ids; at most ${MAX_METRICS_IDS} are allowed`, { count: ids.length });
  return ids;
}

/** Routes of the metrics and logs families, to `.use()` in the app. */
export function telemetryRoutes(orch: SandboxService) {
  return new Elysia({ normalize: false })
    .get(
      "/sandboxes/metrics",
      async ({ query }) => {
        const ids = parseSandboxIds(query.sandbox_ids);
        await orch.watchMetrics(ids, true);
        const latest = orch.latestMetrics(ids);
        return { sandboxes: Object.fromEntries([...latest].map(([id, s]) => [id, toMetric(s)])) };
      },
      {
        query: t.Object({ sandbox_ids: t.String({ description: "comma-separated sandbox ids, at most 100" }) }),
        response: { 200: t.Object({ sandboxes: t.Record(t.String(), S.SandboxMetric) }), ...ERR },
        detail: { summary: "Latest metrics of several sandboxes (unknown ids are left out)", tags: ["sandboxes"] },
      },
    )
    .get(
      "/sandboxes/:sandboxID/metrics",
      async ({ params, query }) => {
        const start = int(query.start);
        const end = int(query.end);
        if (start !== undefined && end !== undefined && end < start) {
          throw new ApiError("api.bad_time_range", `end (${end}) must not be before start (${start})`, { start, end });
        }
        orch.get(params.sandboxID); // 404 before anything is sampled
        await orch.watchMetrics([params.sandboxID], true);
        return orch.metrics(params.sandboxID, start === undefined ? undefined : start * 1000, end === undefined ? undefined : end * 1000 + 999).map(toMetric);
      },
      {
        query: t.Object({ start: Digits("unix seconds, inclusive"), end: Digits("unix seconds, inclusive") }),
        response: { 200: t.Array(S.SandboxMetric), ...ERR },
        detail: { summary: "Sandbox metrics (samples in [start, end])", tags: ["sandboxes"] },
      },
    )
    .get(
      "/sandboxes/:sandboxID/logs",
      ({ params, query }) => {
        // deprecated v1: no maximum in E2B's spec; larger limits are served as 1000
        const limit = Math.min(int(query.limit) ?? MAX_LOG_LIMIT, MAX_LOG_LIMIT);
        const entries = orch.sandboxLogs(params.sandboxID, { cursor: int(query.start), limit, direction: "forward" });
        return { logs: entries.map((e) => ({ timestamp: new Date(e.at).toISOString(), line: e.message })), logEntries: entries.map(toLogEntry) };
      },
      {
        query: t.Object({ start: Digits("unix ms"), limit: Digits("default 1000") }),
        response: { 200: S.SandboxLogs, ...ERR },
        detail: { summary: "Sandbox logs (deprecated; use /v2)", tags: ["sandboxes"] },
      },
    )
    .get(
      "/v2/sandboxes/:sandboxID/logs",
      ({ params, query }) => {
        const limit = int(query.limit) ?? MAX_LOG_LIMIT;
        if (limit > MAX_LOG_LIMIT) throw new ApiError("api.bad_limit", `limit must be between 0 and ${MAX_LOG_LIMIT}, got ${limit}`, { limit });
        const entries = orch.sandboxLogs(params.sandboxID, {
          cursor: int(query.cursor),
          limit,
          direction: query.direction ?? "forward",
          level: query.level as LogLevel | undefined,
          search: query.search || undefined,
        });
        return { logs: entries.map(toLogEntry) };
      },
      {
        query: t.Object({
          cursor: Digits("unix ms"),
          limit: Digits("0..1000, default 1000"),
          direction: t.Optional(t.Union([t.Literal("forward"), t.Literal("backward")])),
          level: t.Optional(t.Union(LOG_LEVELS.map((l) => t.Literal(l)))),
          search: t.Optional(t.String({ maxLength: MAX_LOG_SEARCH })),
        }),
        response: { 200: t.Object({ logs: t.Array(S.SandboxLogEntry) }), ...ERR },
        detail: { summary: "Sandbox logs: lifecycle events, guest console, envd", tags: ["sandboxes"] },
      },
    );
}
