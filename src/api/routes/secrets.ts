/**
 * Secrets routes (E2B `/secrets`, ../shared/docs/e2b-egress-secrets.md §1): create, update (POST,
 * a new version), get info, list (paginated: `limit`, `nextToken`, header `X-Next-Token`), and
 * destroy, as the SDK's `Secret` class calls them. Values are write-only: no answer carries one,
 * and bodies are read as text and parsed here so that no parser's message can quote one. Bodies
 * are strict: an unknown field is a 400 naming it. Every answer has `Cache-Control: no-store`.
 * A cluster node whose secrets the gateway keeps answers 403 `secrets.remote_store`.
 */
import { Elysia } from "elysia";
import { SecretsError, type SecretInfo, type SecretKeeper } from "../../secrets/index.ts";
import { toErrorResponse } from "../status.ts";
import { notJsonReason } from "../../util/json-body.ts";

/** What the routes serve: this node's store (or the gateway's), or where the cluster's store is. */
export type SecretsBackend = { store: SecretKeeper } | { remoteUrl: string };

const NO_STORE = { "cache-control": "no-store" };
const iso = (ms: number) => new Date(ms).toISOString();

/** E2B's `Secret` body. */
export function secretBody(s: SecretInfo) {
  return { secretID: s.secretID, name: s.name, currentVersion: s.currentVersion, metadata: s.metadata, createdAt: iso(s.createdAt), updatedAt: iso(s.updatedAt) };
}

/**
 * The JSON object of a request body with only `allowed` fields, sent as JSON (`contentType`, the
 * rule of every JSON route: src/util/json-body.ts).
 * @throws SecretsError bad_request naming the unknown field, or saying the body is not JSON (its
 *   content type, never its text) or not a JSON object
 */
export function strictBody(text: unknown, allowed: readonly string[], contentType: string | null): Record<string, unknown> {
  const notJson = typeof text === "string" && text.trim() !== "" ? notJsonReason(contentType) : null;
  if (notJson) throw new SecretsError("secrets.bad_request", notJson, { field: "body" });
  let v: unknown;
  try {
    v = JSON.parse(typeof text === "string" ? text : "");
  } catch {
    throw new SecretsError("secrets.bad_request", "the request body is not valid JSON", { field: "body" });
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw new SecretsError("secrets.bad_request", "the request body must be a JSON object", { field: "body" });
  for (const k of Object.keys(v)) {
    if (!allowed.includes(k)) throw new SecretsError("secrets.bad_request", `unknown field ${JSON.stringify(k.slice(0, 64))} (accepted: ${allowed.join(", ")})`, { field: k.slice(0, 64) });
  }
  return v as Record<string, unknown>;
}

async function answer(fn: () => Response | Promise<Response>): Promise<Response> {
  let r: Response;
  try {
    r = await fn();
  } catch (e) {
    r = toErrorResponse(e);
  }
  r.headers.set("cache-control", "no-store");
  return r;
}

/** The `/secrets` routes over `backend`. */
export function secretRoutes(backend: SecretsBackend) {
  const store = (): SecretKeeper => {
    if ("store" in backend) return backend.store;
    throw new SecretsError("secrets.remote_store", `this node's secrets are kept by the cluster gateway (${backend.remoteUrl}): manage them there`, { url: backend.remoteUrl });
  };
  const tags = ["secrets"];
  return new Elysia({ normalize: false })
    .get(
      "/secrets",
      ({ query }) =>
        answer(async () => {
          const q = query as Record<string, string | undefined>;
          for (const k of Object.keys(q)) if (k !== "limit" && k !== "nextToken") throw new SecretsError("secrets.bad_request", `unknown query parameter ${JSON.stringify(k.slice(0, 64))}`, { field: k.slice(0, 64) });
          const limit = q.limit === undefined ? 100 : /^[0-9]{1,3}$/.test(q.limit) ? Number(q.limit) : NaN;
          const page = await store().list(limit, q.nextToken || undefined);
          return Response.json(page.items.map(secretBody), { headers: { ...NO_STORE, ...(page.nextToken ? { "x-next-token": page.nextToken } : {}) } });
        }),
      { detail: { summary: "List secrets (oldest first; X-Next-Token when more pages exist)", tags } },
    )
    .post(
      "/secrets",
      ({ body, request }) =>
        answer(async () => {
          const b = strictBody(body, ["name", "value", "metadata"], request.headers.get("content-type"));
          if (typeof b.name !== "string") throw new SecretsError("secrets.bad_request", "name must be a string", { field: "name" });
          return Response.json(secretBody(await store().create(b.name, b.value, b.metadata ?? {})), { status: 201, headers: NO_STORE });
        }),
      { parse: "text", detail: { summary: "Create a secret (body {name, value, metadata?}; the value is never returned)", tags } },
    )
    .get("/secrets/:secretID", ({ params }) => answer(async () => Response.json(secretBody(await store().get(params.secretID)), { headers: NO_STORE })), {
      detail: { summary: "Get a secret's info (by id or name)", tags },
    })
    .post(
      "/secrets/:secretID",
      ({ params, body, request }) =>
        answer(async () => {
          const b = strictBody(body, ["value", "metadata"], request.headers.get("content-type"));
          return Response.json(secretBody(await store().update(params.secretID, b.value, b.metadata)), { headers: NO_STORE });
        }),
      { parse: "text", detail: { summary: "Give a secret a new value (its next version; metadata replaces the stored one when present)", tags } },
    )
    .delete(
      "/secrets/:secretID",
      ({ params }) =>
        answer(async () => {
          if (!(await store().destroy(params.secretID))) throw new SecretsError("secrets.not_found", "Secret not found", { secret: params.secretID.slice(0, 128) });
          return new Response(null, { status: 204, headers: NO_STORE });
        }),
      { detail: { summary: "Destroy a secret", tags } },
    );
}
