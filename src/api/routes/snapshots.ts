/**
 * Snapshot routes (E2B contract, ../shared/docs/e2b-contract.md §2.4): commit a snapshot of a
 * sandbox, list snapshots, fork a sandbox. `Sandbox.create(snapshotID)` goes through the ordinary
 * create routes (the orchestrator resolves snapshot ids and names); the SDK deletes a snapshot
 * with `DELETE /templates/{id}` (./templates.ts asks the orchestrator first). Wired into the app
 * with one `.use`.
 */
import { Elysia, t } from "elysia";
import { AgentEnvError } from "../../errors.ts";
import type { SandboxService, SnapshotInfo } from "../../orchestrator/index.ts";
import { ErrorBody, Sandbox } from "../schemas.ts";
import { toSandbox } from "../serialize.ts";
import { statusOf } from "../status.ts";
import { strictBody, type BodyPolicy } from "../strict.ts";

const Int = (o: { minimum?: number; maximum?: number; description?: string } = {}) => t.Number({ multipleOf: 1, ...o });
const ERR = { 400: ErrorBody, 401: ErrorBody, 404: ErrorBody, 409: ErrorBody, 500: ErrorBody };

export const SnapshotInfoBody = t.Object({ snapshotID: t.String(), names: t.Array(t.String()) });
/** A listed snapshot: E2B's `SnapshotInfo` plus where it came from (the console draws its tree from them). */
export const ListedSnapshotBody = t.Object({
  snapshotID: t.String(),
  names: t.Array(t.String()),
  sandboxID: t.Union([t.String(), t.Null()], { description: "sandbox it was taken from" }),
  templateID: t.String({ description: "template that sandbox started from" }),
  createdAt: t.String({ format: "date-time" }),
});
export const SnapshotRequestBody = t.Object({ name: t.Optional(t.String({ minLength: 1, maxLength: 200 })) }, { additionalProperties: true });
export const ForkRequestBody = t.Object(
  {
    timeout: t.Optional(Int({ minimum: 0, description: "lifetime of each child, seconds (default 15)" })),
    count: t.Optional(Int({ minimum: 1, maximum: 100, description: "children to create (default 1)" })),
  },
  { additionalProperties: true },
);
export const ForkResultBody = t.Object({ sandbox: t.Optional(Sandbox), error: t.Optional(ErrorBody) });
export const SnapshotListQuery = t.Object({
  sandboxID: t.Optional(t.String()),
  name: t.Optional(t.String()),
  limit: t.Optional(t.String({ pattern: "^[0-9]+$" })),
  nextToken: t.Optional(t.String()),
});

const info = (s: SnapshotInfo) => ({ snapshotID: s.snapshotID, names: s.names });
const listed = (s: SnapshotInfo) => ({ ...info(s), sandboxID: s.sandboxID, templateID: s.templateID, createdAt: new Date(s.createdAt).toISOString() });

/** The E2B error body of a failed fork child (status by its code, as the API answers it). */
function childError(e: Error): { code: number; message: string; error_code: string } {
  const code = e instanceof AgentEnvError ? e.code : "api.internal";
  return { code: statusOf(code) ?? 500, message: e.message, error_code: code };
}

/** Routes of the snapshot family, to `.use()` in the app; `domain` as in the create routes; bodies checked by `bodies`. */
export function snapshotRoutes(orch: SandboxService, domain: string | null, bodies: BodyPolicy) {
  return new Elysia({ name: "snapshots", normalize: false })
    .post(
      "/sandboxes/:sandboxID/snapshots",
      async ({ params, body, set }) => {
        const s = await orch.createSnapshot(params.sandboxID, body?.name);
        set.status = 201;
        return info(s);
      },
      { ...strictBody(bodies, t.Optional(SnapshotRequestBody)), response: { 201: SnapshotInfoBody, ...ERR }, detail: { summary: "Commit a snapshot of a sandbox (it keeps running)", tags: ["snapshots"] } },
    )
    .get(
      "/snapshots",
      ({ query, set }) => {
        const page = orch.listSnapshots({
          sandboxId: query.sandboxID,
          name: query.name,
          limit: query.limit === undefined ? undefined : Number(query.limit),
          nextToken: query.nextToken,
        });
        if (page.nextToken) set.headers["x-next-token"] = page.nextToken;
        return page.items.map(listed);
      },
      { query: SnapshotListQuery, response: { 200: t.Array(ListedSnapshotBody), ...ERR }, detail: { summary: "List snapshots (filters sandboxID, name; pagination)", tags: ["snapshots"] } },
    )
    .post(
      "/sandboxes/:sandboxID/fork",
      async ({ params, body, set }) => {
        const results = await orch.fork(params.sandboxID, { count: body?.count, timeoutSecs: body?.timeout });
        set.status = 201;
        return results.map((r) => (r.sandbox ? { sandbox: toSandbox(r.sandbox, domain) } : { error: childError(r.error!) }));
      },
      { ...strictBody(bodies, t.Optional(ForkRequestBody)), response: { 201: t.Array(ForkResultBody), ...ERR }, detail: { summary: "Fork a sandbox: snapshot it once, start `count` children from the snapshot", tags: ["sandboxes"] } },
    );
}
