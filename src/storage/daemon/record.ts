/**
 * The serving child's record, `<recordDir>/<id>.json`: enough to find and reap the child and its
 * mount after the node crashed. Written by the child before it mounts, removed on clean exit.
 */
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** Contents of a record file. */
export interface DiskRecord {
  id: string;
  pid: number;
  mountPoint: string;
  /** ms since the epoch */
  startedAt: number;
}

/** Path of the record of disk `id`. */
export function recordPath(recordDir: string, id: string): string {
  return join(recordDir, `${id}.json`);
}

/** Write a record atomically (temp file + rename). */
export function writeRecord(recordDir: string, r: DiskRecord): void {
  mkdirSync(recordDir, { recursive: true });
  const tmp = join(recordDir, `.${r.id}.${process.pid}.tmp`);
  writeFileSync(tmp, JSON.stringify(r));
  renameSync(tmp, recordPath(recordDir, r.id));
}

/** Remove a record; a missing one is fine. */
export function removeRecord(recordDir: string, id: string): void {
  rmSync(recordPath(recordDir, id), { force: true });
}

/** Every readable record in `recordDir` (unparsable files are returned as `{ file }` only). */
export function listRecords(recordDir: string): { file: string; record?: DiskRecord }[] {
  let names: string[];
  try {
    names = readdirSync(recordDir);
  } catch {
    return [];
  }
  const out: { file: string; record?: DiskRecord }[] = [];
  for (const n of names) {
    if (!n.endsWith(".json") || n.startsWith(".")) continue;
    const file = join(recordDir, n);
    try {
      const r = JSON.parse(readFileSync(file, "utf8")) as DiskRecord;
      if (typeof r.pid === "number" && typeof r.mountPoint === "string" && typeof r.id === "string") out.push({ file, record: r });
      else out.push({ file });
    } catch {
      out.push({ file });
    }
  }
  return out;
}
