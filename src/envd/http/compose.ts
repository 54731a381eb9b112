/**
 * `POST /files/compose` (envd.yaml ComposeRequest): concatenate `source_paths` in order into
 * `destination` (streamed through a temporary file in the destination's directory, then renamed
 * into place), owned by the user; the sources are deleted afterwards.
 */
import { lstatSync, rmSync, statSync } from "node:fs";
import { open } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { EnvdError, fromFsError } from "../errors.ts";
import { resolvePath } from "../paths.ts";
import { checkedAs, chownTo, ensureDirs, requireAccess, requireParentWritable, R_OK } from "../permissions.ts";
import type { EnvdState } from "../state.ts";
import { lookupUser } from "../users.ts";
import type { UploadedEntry } from "./files.ts";
import { renameDurable } from "../../util/durable.ts";

/** Validated compose request. */
export interface ComposeRequest {
  sourcePaths: string[];
  destination: string;
  username?: string;
}

/**
 * Validate the JSON body.
 * @throws EnvdError `invalid_argument` naming the bad field or the source limit.
 */
export function parseComposeBody(body: unknown, maxSources: number): ComposeRequest {
  const b = (body ?? {}) as Record<string, unknown>;
  const src = b.source_paths;
  if (!Array.isArray(src) || src.length === 0 || !src.every((s) => typeof s === "string" && s !== "")) {
    throw new EnvdError("invalid_argument", "source_paths must be a non-empty array of paths", { field: "source_paths" });
  }
  if (src.length > maxSources) throw new EnvdError("invalid_argument", `at most ${maxSources} source paths`, { count: src.length, limit: maxSources });
  if (typeof b.destination !== "string" || b.destination === "") {
    throw new EnvdError("invalid_argument", "destination must be a path", { field: "destination" });
  }
  if (b.username !== undefined && typeof b.username !== "string") throw new EnvdError("invalid_argument", "username must be a string", { field: "username" });
  return { sourcePaths: src as string[], destination: b.destination, username: (b.username as string) || undefined };
}

/**
 * Run a compose.
 * @throws EnvdError not_found (a source is missing), invalid_argument (a source is a directory),
 *   permission_denied, unauthenticated (unknown user), insufficient_storage.
 */
export async function composeFiles(state: EnvdState, req: ComposeRequest): Promise<UploadedEntry> {
  const user = lookupUser(req.username ?? state.defaultUser);
  const sources = req.sourcePaths.map((p) => resolvePath(p, user, state.defaultWorkdir));
  const dest = resolvePath(req.destination, user, state.defaultWorkdir);
  const checker = checkedAs(user, state.enforcePermissions);
  for (const s of sources) {
    let st;
    try {
      st = statSync(s);
    } catch (err) {
      throw fromFsError(err, s, "compose");
    }
    if (st.isDirectory()) throw new EnvdError("invalid_argument", `source '${s}' is a directory`, { path: s });
    requireAccess(checker, s, R_OK, "compose");
    requireParentWritable(checker, s, "compose");
  }
  try {
    if (lstatSync(dest).isDirectory()) throw new EnvdError("invalid_argument", `destination '${dest}' is a directory`, { path: dest });
  } catch (err) {
    if (err instanceof EnvdError) throw err;
  }
  requireParentWritable(checker, dest, "compose");
  ensureDirs(dirname(dest), user, "compose");
  const tmp = join(dirname(dest), `.${basename(dest)}.compose-${crypto.randomUUID()}`);
  const fh = await open(tmp, "w", 0o644).catch((err) => {
    throw fromFsError(err, tmp, "compose");
  });
  try {
    for (const s of sources) {
      for await (const chunk of Bun.file(s).stream()) {
        let off = 0;
        while (off < chunk.byteLength) off += (await fh.write(chunk, off, chunk.byteLength - off)).bytesWritten;
      }
    }
    await fh.close();
    chownTo(tmp, user);
    renameDurable(tmp, dest);
  } catch (err) {
    await fh.close().catch(() => {});
    rmSync(tmp, { force: true });
    throw fromFsError(err, dest, "compose");
  }
  for (const s of new Set(sources)) if (s !== dest) rmSync(s, { force: true });
  return { path: dest, name: basename(dest), type: "file" };
}
