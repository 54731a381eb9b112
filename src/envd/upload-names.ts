/**
 * Names of the files uploads are written to before they are complete (`POST /files`: a new file
 * beside the target, renamed over it at the end; src/envd/http/files.ts). The directory watcher
 * (src/envd/filesystem/watcher.ts) knows them by name and reports the upload as E2B's envd,
 * which writes in place, would: a create of the target (when it was new) and a write.
 */
import { randomUUID } from "node:crypto";

const UPLOAD_TEMP_RE = /^\.(.+)\.upload-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** A fresh name (in the same directory) for an upload of the file named `base`. */
export function uploadTempName(base: string): string {
  return `.${base}.upload-${randomUUID()}`;
}

/** The name of the file an upload's temporary file `name` will become, or null when `name` is none. */
export function uploadTargetOf(name: string): string | null {
  return UPLOAD_TEMP_RE.exec(name)?.[1] ?? null;
}
