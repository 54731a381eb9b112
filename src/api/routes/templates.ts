/**
 * Template build routes of the E2B API (../shared/docs/template-build.md §2, e2b openapi):
 * `POST /v3/templates`, `GET /templates/{id}/files/{hash}`, `POST /v2/templates/{id}/builds/{b}`,
 * build status and logs, `GET|DELETE /templates/{id}`, `GET /templates/aliases/{alias}`, tags.
 * The file upload itself (`PUT /upload/template-files/{hash}`, authorised by the URL's token, not
 * the API key) is `handleUpload`, called by the listener before the API key check.
 * Thin: every route checks its input and calls `TemplateService`; a TemplateError answers the
 * status its code has in src/api/status.ts.
 */
import { Elysia, t } from "elysia";
import type { SandboxService } from "../../orchestrator/index.ts";
import { TemplateError, TemplateService, UPLOAD_PATH_RE, type LogLevel, type TemplateRecord } from "../../template/index.ts";
import { ENVD_VERSION } from "../../envd/version.ts";
import { errorResponse, toErrorResponse } from "../status.ts";
import { strictBody, type BodyPolicy } from "../strict.ts";

const iso = (ms: number) => new Date(ms).toISOString();
const LEVEL = t.Optional(t.Union([t.Literal("debug"), t.Literal("info"), t.Literal("warn"), t.Literal("error")]));
const QInt = t.Optional(t.String({ pattern: "^[0-9]+$" }));
const accepted = () => new Response("{}", { status: 202, headers: { "content-type": "application/json", "content-length": "2" } });
const noContent = () => new Response(null, { status: 204 });
const open = { additionalProperties: true };

/** E2B `TemplateBuildRequestV3` (`POST /v3/templates`). */
const TemplateBuildRequestV3 = t.Object(
  {
    name: t.Optional(t.String({ minLength: 1, maxLength: 128 })),
    alias: t.Optional(t.String({ minLength: 1, maxLength: 128 })),
    tags: t.Optional(t.Array(t.String())),
    cpuCount: t.Optional(t.Number({ multipleOf: 1 })),
    memoryMB: t.Optional(t.Number({ multipleOf: 1 })),
    minFreeDiskMb: t.Optional(t.Number({ description: "E2B: free disk the build keeps (not enforced here)" })),
    teamID: t.Optional(t.String({ description: "E2B: the team (one team per node)" })),
  },
  open,
);

/** E2B `TemplateBuildStartV2` (`POST /v2/templates/{id}/builds/{buildID}`); values checked by src/template/spec.ts. */
const TemplateBuildStartV2 = t.Object(
  {
    force: t.Optional(t.Any()),
    fromImage: t.Optional(t.Any()),
    fromImageRegistry: t.Optional(t.Any({ description: "E2B FromImageRegistry (aws | gcp | registry)" })),
    fromTemplate: t.Optional(t.Any()),
    from: t.Optional(
      t.Any({ description: "AgentENV: a Dockerfile's FROM, resolved here: a template of this node (id or alias, optional :tag) is built on, anything else is an image reference; instead of fromImage / fromTemplate" }),
    ),
    readyCmd: t.Optional(t.Any()),
    startCmd: t.Optional(t.Any()),
    steps: t.Optional(t.Array(t.Object({ type: t.Any(), args: t.Optional(t.Any()), filesHash: t.Optional(t.Any()), force: t.Optional(t.Any()) }, open))),
  },
  open,
);

/** The request's own origin (the SDK's E2B_API_URL), for upload URLs. */
function originOf(request: Request): string {
  const u = new URL(request.url);
  const host = request.headers.get("x-forwarded-host") ?? request.headers.get("host") ?? u.host;
  const proto = request.headers.get("x-forwarded-proto") ?? u.protocol.replace(":", "");
  return `${proto}://${host}`;
}

/** E2B `TemplateWithBuilds`. */
function withBuilds(tpl: TemplateRecord, spawn: { spawnCount: number; lastSpawnedAt: number | null }) {
  return {
    templateID: tpl.templateID,
    public: tpl.public,
    aliases: tpl.aliases,
    names: tpl.aliases,
    createdAt: iso(tpl.createdAt),
    updatedAt: iso(tpl.updatedAt),
    lastSpawnedAt: spawn.lastSpawnedAt === null ? null : iso(spawn.lastSpawnedAt),
    spawnCount: spawn.spawnCount,
    builds: tpl.builds.map((b) => ({
      buildID: b.buildID,
      status: b.status,
      createdAt: iso(b.createdAt),
      updatedAt: iso(b.updatedAt),
      ...(b.finishedAt ? { finishedAt: iso(b.finishedAt) } : {}),
      cpuCount: b.cpuCount,
      memoryMB: b.memoryMB,
      diskSizeMB: b.diskSizeMB,
      envdVersion: ENVD_VERSION,
    })),
  };
}

/**
 * `PUT /upload/template-files/{hash}?expires&token`: store an upload if the URL's token is valid.
 * @returns null when `req` is not an upload request (the listener goes on with the API).
 */
export async function handleUpload(req: Request, url: URL, templates: TemplateService): Promise<Response | null> {
  const m = UPLOAD_PATH_RE.exec(url.pathname);
  if (!m) return null;
  if (req.method !== "PUT") return errorResponse("api.no_route", "uploads use PUT");
  try {
    const q = url.searchParams;
    const n = await templates.acceptUpload(m[1]!, { template: q.get("template"), expires: q.get("expires"), token: q.get("token") }, req.body);
    return Response.json({ hash: m[1], bytes: n }, { status: 201 });
  } catch (e) {
    return toErrorResponse(e);
  }
}

/** The template build routes, for `app.use(...)`; bodies checked by `bodies`. */
export function templateRoutes(templates: TemplateService, orch: SandboxService, bodies: BodyPolicy) {
  const spawnOf = async (id: string) => {
    const l = (await orch.listTemplates()).find((x) => x.templateID === id);
    return { spawnCount: l?.spawnCount ?? 0, lastSpawnedAt: l?.lastSpawnedAt ?? null };
  };
  return new Elysia({ name: "templates" })
    .post(
      "/v3/templates",
      ({ body, set }) => {
        const r = templates.request(body);
        set.status = 202;
        return r;
      },
      {
        ...strictBody(bodies, TemplateBuildRequestV3),
        detail: { summary: "Register a template build (E2B SDK Template.build)", tags: ["templates"] },
      },
    )
    .get("/templates/:templateID/files/:hash", ({ params, request, set }) => {
      const r = templates.fileUpload(params.templateID, params.hash, originOf(request));
      set.status = 201;
      return r;
    }, { detail: { summary: "Whether a COPY step's files are here, and the URL to PUT them to", tags: ["templates"] } })
    .post(
      "/v2/templates/:templateID/builds/:buildID",
      ({ params, body }) => {
        templates.start(params.templateID, params.buildID, (body ?? {}) as Record<string, unknown>);
        return accepted();
      },
      { ...strictBody(bodies, TemplateBuildStartV2), detail: { summary: "Start a registered build (steps, base, start and ready commands)", tags: ["templates"] } },
    )
    .get(
      "/templates/:templateID/builds/:buildID/status",
      ({ params, query }) =>
        templates.status(params.templateID, params.buildID, {
          logsOffset: query.logsOffset === undefined ? 0 : Number(query.logsOffset),
          limit: query.limit === undefined ? 100 : Math.min(100, Number(query.limit)),
          level: query.level as LogLevel | undefined,
        }),
      { query: t.Object({ logsOffset: QInt, limit: QInt, level: LEVEL }), detail: { summary: "Build status and log entries from logsOffset", tags: ["templates"] } },
    )
    .get(
      "/templates/:templateID/builds/:buildID/logs",
      ({ params, query }) =>
        templates.logs(params.templateID, params.buildID, {
          cursor: query.cursor === undefined ? undefined : Number(query.cursor),
          limit: query.limit === undefined ? 100 : Math.min(100, Number(query.limit)),
          direction: query.direction,
          level: query.level as LogLevel | undefined,
        }),
      {
        query: t.Object({ cursor: QInt, limit: QInt, direction: t.Optional(t.Union([t.Literal("forward"), t.Literal("backward")])), level: LEVEL, source: t.Optional(t.String()) }),
        detail: { summary: "Build logs by time", tags: ["templates"] },
      },
    )
    .get("/templates/aliases/:alias", ({ params }) => {
      const tpl = templates.catalog.find(params.alias);
      if (!tpl || !tpl.aliases.includes(params.alias)) throw new TemplateError("template.not_found", `template alias '${params.alias}' not found`, { template: params.alias });
      return { templateID: tpl.templateID, public: tpl.public };
    }, { detail: { summary: "Look a template up by alias", tags: ["templates"] } })
    .post(
      "/templates/tags",
      ({ body, set }) => {
        const r = templates.catalog.assignTags(body.target, body.tags);
        set.status = 201;
        return r;
      },
      { ...strictBody(bodies, t.Object({ target: t.String({ minLength: 1 }), tags: t.Array(t.String(), { minItems: 1 }) }, open)), detail: { summary: "Point tags at a build (name:tag)", tags: ["templates"] } },
    )
    .delete(
      "/templates/tags",
      ({ body }) => {
        templates.catalog.removeTags(body.name, body.tags);
        return noContent();
      },
      { ...strictBody(bodies, t.Object({ name: t.String({ minLength: 1 }), tags: t.Array(t.String(), { minItems: 1 }) }, open)), detail: { summary: "Remove tags from a template", tags: ["templates"] } },
    )
    .get("/templates/:templateID/tags", ({ params }) => {
      const tpl = templates.get(params.templateID);
      return Object.entries(tpl.tags)
        .map(([tag, v]) => ({ tag, buildID: v.buildID, createdAt: iso(v.createdAt) }))
        .sort((a, b) => a.tag.localeCompare(b.tag));
    }, { detail: { summary: "List a template's tags", tags: ["templates"] } })
    .get("/templates/:templateID", async ({ params }) => {
      const tpl = templates.get(params.templateID);
      return withBuilds(tpl, await spawnOf(tpl.templateID));
    }, { detail: { summary: "A template with its builds", tags: ["templates"] } })
    .delete("/templates/:templateID", async ({ params }) => {
      // the SDK's deleteSnapshot comes here too: a snapshot id or name first
      if (!(await orch.deleteSnapshot(params.templateID))) templates.remove(params.templateID);
      return noContent();
    }, { detail: { summary: "Delete a template or a snapshot (Sandbox.deleteSnapshot)", tags: ["templates"] } });
}
