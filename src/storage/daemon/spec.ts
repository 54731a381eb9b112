/**
 * Plain-data description of one disk export, written as JSON for the serving child
 * (`agentenv disk serve --spec FILE`), and the function that opens the image it names.
 */
import type { BlockImage } from "../block.ts";
import { DiskError } from "./errors.ts";
import { RawFileImage } from "./raw.ts";
import { openStack } from "../overlaybd/index.ts";

/**
 * What to serve. `raw`: one plain file. `overlaybd`: read-only layer files (bottom first, shared
 * by every sandbox of a template, opened O_RDONLY) plus a writable upper (data + index files);
 * with `readOnly` the upper is opened O_RDONLY too and the served file refuses writes (one of
 * several readers of a volume).
 */
export type DiskImageSpec =
  | { kind: "raw"; path: string; readOnly: boolean; acceptWritableOpen?: boolean }
  | { kind: "overlaybd"; lowers: string[]; upper: { data: string; index: string }; readOnly?: boolean };

/** Tunables of the FUSE export (from config `[disk]`). */
export interface FuseTuning {
  /** Reader threads blocking on /dev/fuse. */
  workers: number;
  /** Largest READ/WRITE in bytes. */
  maxWrite: number;
  /** FOPEN_DIRECT_IO on the served file. */
  directIo: boolean;
  /** Kernel FUSE request timeout, seconds (0 = none). */
  requestTimeoutSec: number;
}

/** Everything the serving child needs. */
export interface ServeSpec {
  /** Disk id (sandbox id + disk name); names the record in `<runtimeDir>/disks/<id>.json`. */
  id: string;
  image: DiskImageSpec;
  /** Directory the FUSE filesystem is mounted on. */
  mountPoint: string;
  /** Name of the served file inside the mount. */
  fileName: string;
  /** Directory holding the child's record (pid, mount point) for reaping after a crash. */
  recordDir: string;
  tuning: FuseTuning;
}

const ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

/**
 * Check a spec parsed from JSON.
 * @throws DiskError `disk.bad_spec` naming the field at fault
 */
export function validateServeSpec(v: unknown): ServeSpec {
  const bad = (field: string, value: unknown) =>
    new DiskError("disk.bad_spec", `invalid disk spec: ${field}`, { field, value: value === undefined ? null : value });
  if (typeof v !== "object" || v === null) throw bad("spec", v);
  const s = v as Record<string, any>;
  if (typeof s.id !== "string" || !ID_RE.test(s.id)) throw bad("id", s.id);
  for (const f of ["mountPoint", "recordDir"] as const) {
    if (typeof s[f] !== "string" || !s[f].startsWith("/")) throw bad(f, s[f]);
  }
  if (typeof s.fileName !== "string" || !/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(s.fileName)) throw bad("fileName", s.fileName);
  const img = s.image;
  if (typeof img !== "object" || img === null) throw bad("image", img);
  if (img.kind === "raw") {
    if (typeof img.path !== "string" || !img.path.startsWith("/")) throw bad("image.path", img.path);
    if (typeof img.readOnly !== "boolean") throw bad("image.readOnly", img.readOnly);
    if (img.acceptWritableOpen !== undefined && typeof img.acceptWritableOpen !== "boolean") throw bad("image.acceptWritableOpen", img.acceptWritableOpen);
  } else if (img.kind === "overlaybd") {
    if (!Array.isArray(img.lowers) || img.lowers.length === 0) throw bad("image.lowers", img.lowers);
    for (const l of img.lowers) if (typeof l !== "string" || !l.startsWith("/")) throw bad("image.lowers", l);
    const u = img.upper;
    if (typeof u !== "object" || u === null) throw bad("image.upper", u);
    for (const f of ["data", "index"]) if (typeof u[f] !== "string" || !u[f].startsWith("/")) throw bad(`image.upper.${f}`, u[f]);
    if (img.readOnly !== undefined && typeof img.readOnly !== "boolean") throw bad("image.readOnly", img.readOnly);
  } else {
    throw bad("image.kind", img.kind);
  }
  const t = s.tuning;
  if (typeof t !== "object" || t === null) throw bad("tuning", t);
  for (const f of ["workers", "maxWrite", "requestTimeoutSec"]) if (!Number.isInteger(t[f])) throw bad(`tuning.${f}`, t[f]);
  if (typeof t.directIo !== "boolean") throw bad("tuning.directIo", t.directIo);
  return s as ServeSpec;
}

/**
 * Open the image a spec names.
 * @throws DiskError `disk.open_failed`, `disk.bad_spec`
 */
export async function openImage(spec: DiskImageSpec): Promise<BlockImage> {
  switch (spec.kind) {
    case "raw":
      return RawFileImage.open(spec.path, { readOnly: spec.readOnly });
    case "overlaybd":
      return openStack({ lowers: spec.lowers, upper: spec.upper, upperReadOnly: spec.readOnly === true });
  }
}
