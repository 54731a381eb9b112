/**
 * Volume routes: E2B's `POST/GET /volumes`, `GET/DELETE /volumes/{volumeID}` (API key), and the
 * volume content API the SDK's `Volume` object calls (`/volumecontent/{volumeID}/dir|path|file`,
 * authenticated by the volume's own token as `Authorization: Bearer <token>`, not the API key).
 * Shapes: ../shared/contracts/e2b/openapi.yml (`Volume`, `VolumeAndToken`, `NewVolume`) and the
 * SDK's volume schema (`VolumeEntryStat`: times as RFC 3339, mode = permission bits).
 */
import { Elysia, t } from "elysia";
import type { SandboxService, VolumeRecord } from "../../orchestrator/index.ts";
import type { VolumeEntry, VolumeFiles } from "../../volume/types.ts";
import { ApiError } from "../errors.ts";
import * as S from "../schemas.ts";
import { strictBody, type BodyPolicy } from "../strict.ts";

const ERR = { 400: S.ErrorBody, 401: S.ErrorBody, 404: S.ErrorBody, 409: S.ErrorBody, 500: S.ErrorBody };
/** Deepest listing one request may ask for. */
export const MAX_LIST_DEPTH = 100;

const Digits = (description: string) => t.Optional(t.String({ pattern: "^[0-9]{1,10}$", description }));
const Bool = t.Optional(t.Union([t.Literal("true"), t.Literal("false")]));
const WriteQuery = t.Object({
  path: t.String({ description: "volume-relative path, e.g. /data/a.txt" }),
  uid: Digits("owner uid (default [volumes] default_uid)"),
  gid: Digits("owner gid (default [volumes] default_gid)"),
  mode: Digits("permission bits as a decimal number, e.g. 493 = 0o755"),
  force: Bool,
});

function toEntry(e: VolumeEntry) {
  const iso = (ms: number) => new Date(ms).toISOString();
  return { name: e.name, path: e.path, type: e.type, size: e.size, mode: e.mode, uid: e.uid, gid: e.gid, atime: iso(e.atime), mtime: iso(e.mtime), ctime: iso(e.ctime), ...(e.target !== undefined ? { target: e.target } : {}) };
}

const withToken = (v: VolumeRecord) => ({ volumeID: v.id, name: v.name, token: v.token });
const num = (s: string | undefined) => (s === undefined ? undefined : Number(s));
const writeOpts = (q: { uid?: string; gid?: string; mode?: string; force?: string }) => ({ uid: num(q.uid), gid: num(q.gid), mode: num(q.mode), force: q.force === "true" });

/** Routes of the volume family, to `.use()` in the app; bodies checked by `bodies`. */
export function volumeRoutes(orch: SandboxService, bodies: BodyPolicy) {
  const vols = orch.volumes;
  /** Check the volume's bearer token. @throws ApiError 401; OrchestratorError 404 for an unknown volume. */
  const authorize = (id: string, authorization: string | undefined) => {
    const v = vols.get(id);
    const m = /^Bearer\s+(\S+)$/i.exec(authorization ?? "");
    if (!vols.tokenMatches(v, m?.[1] ?? null)) throw new ApiError("api.unauthorized", `missing or wrong volume token for volume ${id} (Authorization: Bearer <token from GET /volumes/${id}>)`, { volumeId: id });
  };
  const op = <T>(id: string, write: boolean, fn: (f: VolumeFiles) => Promise<T>) => vols.withFiles(id, write, async (f) => ({ value: await fn(f) }));

  return new Elysia({ normalize: false })
    .post(
      "/volumes",
      async ({ body, set }) => {
        set.status = 201;
        return withToken(await vols.create(body.name));
      },
      {
        ...strictBody(bodies, t.Object({ name: t.String({ description: "DNS label: 1-63 of a-z, 0-9, -" }) }, { additionalProperties: true })),
        response: { 201: S.VolumeAndToken, ...ERR },
        detail: { summary: "Create a volume (an empty ext4 filesystem)", tags: ["volumes"] },
      },
    )
    .get("/volumes", () => vols.list().map((v) => ({ volumeID: v.id, name: v.name })), {
      response: { 200: t.Array(S.Volume), ...ERR },
      detail: { summary: "List volumes", tags: ["volumes"] },
    })
    .get("/volumes/:volumeID", ({ params }) => withToken(vols.get(params.volumeID)), {
      response: { 200: S.VolumeAndToken, ...ERR },
      detail: { summary: "Get a volume and its content token", tags: ["volumes"] },
    })
    .delete(
      "/volumes/:volumeID",
      async ({ params }) => {
        await vols.delete(params.volumeID);
        return new Response(null, { status: 204 });
      },
      { detail: { summary: "Delete a volume (409 while a sandbox mounts it)", tags: ["volumes"] } },
    )
    .get(
      "/volumecontent/:volumeID/dir",
      async ({ params, query, headers }) => {
        authorize(params.volumeID, headers.authorization);
        const depth = num(query.depth) ?? 1;
        if (depth < 1 || depth > MAX_LIST_DEPTH) throw new ApiError("api.bad_depth", `depth must be between 1 and ${MAX_LIST_DEPTH}, got ${depth}`, { depth });
        return (await op(params.volumeID, false, (f) => f.list(query.path ?? "/", depth))).map(toEntry);
      },
      {
        query: t.Object({ path: t.Optional(t.String()), depth: Digits("levels, default 1") }),
        response: { 200: t.Array(S.VolumeEntryStat), ...ERR },
        detail: { summary: "List a directory of a volume", tags: ["volumes"] },
      },
    )
    .post(
      "/volumecontent/:volumeID/dir",
      async ({ params, query, headers, set }) => {
        authorize(params.volumeID, headers.authorization);
        set.status = 201;
        return toEntry(await op(params.volumeID, true, (f) => f.makeDir(query.path, writeOpts(query))));
      },
      { query: WriteQuery, response: { 201: S.VolumeEntryStat, ...ERR }, detail: { summary: "Make a directory in a volume (force: parents too)", tags: ["volumes"] } },
    )
    .get(
      "/volumecontent/:volumeID/path",
      async ({ params, query, headers }) => {
        authorize(params.volumeID, headers.authorization);
        return toEntry(await op(params.volumeID, false, (f) => f.stat(query.path)));
      },
      { query: t.Object({ path: t.String() }), response: { 200: S.VolumeEntryStat, ...ERR }, detail: { summary: "Information about a path of a volume", tags: ["volumes"] } },
    )
    .patch(
      "/volumecontent/:volumeID/path",
      async ({ params, query, headers, body }) => {
        authorize(params.volumeID, headers.authorization);
        return toEntry(await op(params.volumeID, true, (f) => f.setMetadata(query.path, body ?? {})));
      },
      {
        query: t.Object({ path: t.String() }),
        ...strictBody(bodies, t.Optional(t.Object({ uid: t.Optional(S.Uint32), gid: t.Optional(S.Uint32), mode: t.Optional(S.Uint32) }, { additionalProperties: true }))),
        response: { 200: S.VolumeEntryStat, ...ERR },
        detail: { summary: "Change owner or mode of a path of a volume", tags: ["volumes"] },
      },
    )
    .delete(
      "/volumecontent/:volumeID/path",
      async ({ params, query, headers }) => {
        authorize(params.volumeID, headers.authorization);
        await op(params.volumeID, true, (f) => f.remove(query.path));
        return new Response(null, { status: 204 });
      },
      { query: t.Object({ path: t.String() }), detail: { summary: "Remove a file or directory tree of a volume", tags: ["volumes"] } },
    )
    .get(
      "/volumecontent/:volumeID/file",
      async ({ params, query, headers }) => {
        authorize(params.volumeID, headers.authorization);
        return vols.withFiles(params.volumeID, false, async (f) => {
          const { size, stream } = await f.readFile(query.path);
          // the operation (and the node's hold on the volume) ends with the stream
          let end!: () => void;
          const done = new Promise<void>((r) => (end = r));
          const reader = stream.getReader();
          const body = new ReadableStream<Uint8Array>({
            async pull(c) {
              try {
                const r = await reader.read();
                if (r.done) {
                  c.close();
                  end();
                } else c.enqueue(r.value);
              } catch (e) {
                c.error(e);
                end();
              }
            },
            cancel(reason) {
              end();
              return reader.cancel(reason);
            },
          });
          return { value: new Response(body, { headers: { "content-type": "application/octet-stream", "content-length": String(size) } }), done };
        });
      },
      { query: t.Object({ path: t.String() }), detail: { summary: "Read a file of a volume (octet-stream)", tags: ["volumes"] } },
    )
    .put(
      "/volumecontent/:volumeID/file",
      async ({ params, query, headers, request }) => {
        authorize(params.volumeID, headers.authorization);
        return toEntry(await op(params.volumeID, true, (f) => f.writeFile(query.path, request.body, writeOpts(query))));
      },
      {
        parse: "none",
        query: WriteQuery,
        response: { 200: S.VolumeEntryStat, ...ERR },
        detail: { summary: "Create or replace a file of a volume (octet-stream body, streamed)", tags: ["volumes"] },
      },
    );
}
