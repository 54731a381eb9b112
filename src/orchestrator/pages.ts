/**
 * Paged lists of the API: live sandboxes and user snapshots, ordered, filtered, and continued
 * with `nextToken` (an opaque url-safe cursor).
 */
import { OrchestratorError } from "./errors.ts";
import type { SnapshotInfo } from "./runtime.ts";
import { LIVE_STATES, publicState } from "./states.ts";
import type { ListCursor, SandboxStore } from "./store.ts";
import type { ListSandboxesQuery, SandboxRecord } from "./types.ts";

/** Encode a list cursor as an opaque url-safe token. */
export function encodeCursor(c: ListCursor): string {
  return Buffer.from(`${c.startedAt}:${c.id}`).toString("base64url");
}

/** Decode a list cursor. @throws OrchestratorError bad_request (400) for anything malformed. */
export function decodeCursor(token: string): ListCursor {
  const m = /^(\d{1,16}):([a-z0-9]{1,64})$/.exec(Buffer.from(token, "base64url").toString());
  if (!m) throw new OrchestratorError("orchestrator.bad_request", `invalid nextToken ${JSON.stringify(token)}`, { nextToken: token });
  return { startedAt: Number(m[1]), id: m[2]! };
}

/**
 * One page of live sandboxes matching `q`; `nextToken` is set when more exist.
 * @throws OrchestratorError bad_request (400) for a malformed nextToken.
 */
export function sandboxPage(store: SandboxStore, q: ListSandboxesQuery): { items: SandboxRecord[]; nextToken?: string } {
  const want = q.states ?? ["running", "paused"];
  const states = LIVE_STATES.filter((s) => want.includes(publicState(s)!));
  const cursor = q.nextToken ? decodeCursor(q.nextToken) : undefined;
  const md = Object.entries(q.metadata ?? {});
  const { items, more } = store.page({
    states,
    // E2B's spec and SDK 2.51 (`SandboxListOpts.order`): newest first unless asked otherwise
    order: q.order ?? "desc",
    limit: q.limit ?? 100,
    cursor,
    template: q.template,
    startedAfter: q.startedAfter,
    keep: (r) => md.every(([k, v]) => r.metadata[k] === v),
  });
  const last = items[items.length - 1];
  return { items, nextToken: more && last ? encodeCursor({ startedAt: last.startedAt, id: last.id }) : undefined };
}

/** What a list of snapshots may be filtered by, and where a page starts. */
export interface SnapshotQuery {
  sandboxId?: string;
  name?: string;
  limit?: number;
  nextToken?: string;
}

/**
 * One page of `all` (user snapshots, oldest first) whose source is `q.sandboxId` and/or that
 * carry `q.name` (exactly, without its `:tag`, or as their id).
 * @throws OrchestratorError bad_request for a bad limit or nextToken
 */
export function snapshotPage(all: SnapshotInfo[], q: SnapshotQuery): { items: SnapshotInfo[]; nextToken?: string } {
  const limit = q.limit ?? 100;
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw new OrchestratorError("orchestrator.bad_request", `limit must be between 1 and 100, got ${limit}`, { limit });
  const after = q.nextToken ? decodeCursor(q.nextToken) : undefined;
  const matching = all.filter(
    (s) =>
      (q.sandboxId === undefined || s.sandboxID === q.sandboxId) &&
      (q.name === undefined || s.snapshotID === q.name || s.names.some((n) => n === q.name || n.replace(/:[^:/]*$/, "") === q.name)) &&
      (!after || s.createdAt > after.startedAt || (s.createdAt === after.startedAt && s.snapshotID > after.id)),
  );
  const items = matching.slice(0, limit);
  const last = items[items.length - 1];
  return { items, nextToken: matching.length > limit && last ? encodeCursor({ startedAt: last.createdAt, id: last.snapshotID }) : undefined };
}
