/**
 * The content API's file operations on a volume mounted on the node (`HostVolume.root`). Every
 * path is resolved inside the volume: `..` is refused when parsed, and the directory an
 * operation works in is resolved with realpath(3) and must stay under the root, so a symlink in
 * the volume can never lead the node to a file outside it. Final components are never followed
 * (lstat, lchown, replace by rename), except for reading a file, whose real path is checked too.
 */
import { chmodSync, lchownSync, lstatSync, mkdirSync, readdirSync, readlinkSync, realpathSync, rmSync, type Stats } from "node:fs";
import { basename, dirname, join } from "node:path";
import { VolumeError } from "./errors.ts";
import { volumePath } from "./paths.ts";
import type { VolumeEntry, VolumeFiles, VolumeMetadata, VolumeWriteOptions } from "./types.ts";
import { renameDurable } from "../util/durable.ts";
import { errorCode, errorMessage } from "../util/error.ts";

/** Owner and modes given to what the content API creates without explicit metadata. */
export interface CreateDefaults {
  uid: number;
  gid: number;
  fileMode: number;
  dirMode: number;
}

function entryOf(st: Stats, vpath: string, abs: string): VolumeEntry {
  const type = st.isSymbolicLink() ? "symlink" : st.isDirectory() ? "directory" : st.isFile() ? "file" : "unknown";
  return {
    name: vpath === "/" ? "" : basename(vpath),
    path: vpath,
    type,
    size: st.size,
    mode: st.mode & 0o7777,
    uid: st.uid,
    gid: st.gid,
    atime: st.atimeMs,
    mtime: st.mtimeMs,
    ctime: st.ctimeMs,
    ...(type === "symlink" ? { target: readlinkSync(abs) } : {}),
  };
}

/** File operations on a volume mounted at `root` on the node. */
export class HostFiles implements VolumeFiles {
  private readonly realRoot: string;

  constructor(
    root: string,
    private readonly readOnly: boolean,
    private readonly defaults: CreateDefaults,
    /** Bound on entries one list returns. */
    private readonly maxEntries: number,
  ) {
    this.realRoot = realpathSync(root);
  }

  async list(path: string, depth: number): Promise<VolumeEntry[]> {
    const { vp, abs } = this.resolve(path);
    const st = this.lstat(abs, vp);
    if (!st.isDirectory()) throw new VolumeError("volume.not_a_directory", `${vp} is not a directory`, { path: vp });
    const out: VolumeEntry[] = [];
    const walk = (dirAbs: string, dirVp: string, level: number) => {
      for (const name of readdirSync(dirAbs).sort()) {
        if (out.length >= this.maxEntries) {
          throw new VolumeError("volume.too_many_entries", `${vp} holds more than ${this.maxEntries} entries within depth ${depth}`, { path: vp, limit: this.maxEntries });
        }
        const a = join(dirAbs, name);
        const v = dirVp === "/" ? `/${name}` : `${dirVp}/${name}`;
        const s = lstatSync(a);
        out.push(entryOf(s, v, a));
        if (s.isDirectory() && level < depth) walk(a, v, level + 1);
      }
    };
    walk(abs, vp, 1);
    return out.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  }

  async stat(path: string): Promise<VolumeEntry> {
    const { vp, abs } = this.resolve(path);
    return entryOf(this.lstat(abs, vp), vp, abs);
  }

  async makeDir(path: string, opts: VolumeWriteOptions): Promise<VolumeEntry> {
    this.writable();
    const { vp, abs } = this.resolve(path, opts.force === true);
    const existing = this.tryLstat(abs);
    if (existing) {
      if (opts.force && existing.isDirectory()) return this.applyMeta(abs, vp, opts, false);
      throw new VolumeError("volume.exists", `${vp} already exists`, { path: vp });
    }
    try {
      mkdirSync(abs, { mode: opts.mode ?? this.defaults.dirMode });
    } catch (e) {
      throw this.ioError("mkdir", vp, e);
    }
    return this.applyMeta(abs, vp, { ...opts, mode: opts.mode ?? this.defaults.dirMode }, true);
  }

  async readFile(path: string): Promise<{ size: number; stream: ReadableStream<Uint8Array> }> {
    const { vp, abs } = this.resolve(path);
    this.lstat(abs, vp);
    const real = realpathSync(abs);
    this.inside(real, vp);
    const st = lstatSync(real);
    if (st.isDirectory()) throw new VolumeError("volume.is_a_directory", `${vp} is a directory`, { path: vp });
    const file = Bun.file(real);
    return { size: st.size, stream: file.stream() };
  }

  async writeFile(path: string, body: ReadableStream<Uint8Array> | null, opts: VolumeWriteOptions): Promise<VolumeEntry> {
    this.writable();
    const { vp, abs } = this.resolve(path, opts.force === true);
    if (vp === "/") throw new VolumeError("volume.is_a_directory", "/ is the volume's root directory", { path: vp });
    if (this.tryLstat(abs)?.isDirectory()) throw new VolumeError("volume.is_a_directory", `${vp} is a directory`, { path: vp });
    // written beside the target and renamed over it: a symlink at the target is replaced, never followed
    const tmp = join(dirname(abs), `.aenv-upload-${process.pid}-${Math.random().toString(36).slice(2)}`);
    try {
      const w = Bun.file(tmp).writer();
      if (body) for await (const chunk of body) w.write(chunk);
      await w.end();
      this.applyMeta(tmp, vp, { ...opts, mode: opts.mode ?? this.defaults.fileMode }, true);
      renameDurable(tmp, abs);
    } catch (e) {
      rmSync(tmp, { force: true });
      if (e instanceof VolumeError) throw e;
      throw this.ioError("write", vp, e);
    }
    return entryOf(lstatSync(abs), vp, abs);
  }

  async remove(path: string): Promise<void> {
    this.writable();
    const { vp, abs } = this.resolve(path);
    if (vp === "/") throw new VolumeError("volume.bad_path", "the volume's root directory cannot be removed", { path: vp });
    this.lstat(abs, vp);
    try {
      rmSync(abs, { recursive: true });
    } catch (e) {
      throw this.ioError("remove", vp, e);
    }
  }

  async setMetadata(path: string, meta: VolumeMetadata): Promise<VolumeEntry> {
    this.writable();
    const { vp, abs } = this.resolve(path);
    this.lstat(abs, vp);
    return this.applyMeta(abs, vp, meta, false);
  }

  // ---- internals ----

  /**
   * Absolute path of volume path `path`. The directory it lives in must resolve inside the
   * volume; with `createParents` missing directories are made first (owned like new directories).
   */
  private resolve(path: string, createParents = false): { vp: string; abs: string } {
    const vp = volumePath(path);
    const abs = vp === "/" ? this.realRoot : join(this.realRoot, vp);
    if (vp === "/") return { vp, abs };
    const parent = dirname(abs);
    let realParent: string;
    try {
      realParent = realpathSync(parent);
    } catch (e) {
      if (errorCode(e) !== "ENOENT" && errorCode(e) !== "ENOTDIR") throw this.ioError("resolve", vp, e);
      if (!createParents || this.readOnly) throw new VolumeError("volume.path_not_found", `the directory of ${vp} does not exist`, { path: vp });
      this.makeParents(parent, vp);
      realParent = realpathSync(parent);
    }
    this.inside(realParent, vp);
    return { vp, abs: join(realParent, basename(abs)) };
  }

  /** mkdir -p of `dir`, each new directory checked to be inside the volume before going deeper. */
  private makeParents(dir: string, vp: string): void {
    const rel = dir.slice(this.realRoot.length + 1).split("/");
    let cur = this.realRoot;
    for (const seg of rel) {
      const next = join(realpathSync(cur), seg);
      this.inside(dirname(next), vp);
      const st = this.tryLstat(next);
      if (!st) {
        mkdirSync(next, { mode: this.defaults.dirMode });
        lchownSync(next, this.defaults.uid, this.defaults.gid);
      } else if (!st.isDirectory() && !st.isSymbolicLink()) {
        throw new VolumeError("volume.not_a_directory", `${next.slice(this.realRoot.length)} is not a directory`, { path: vp });
      }
      cur = next;
    }
  }

  private inside(real: string, vp: string): void {
    if (real !== this.realRoot && !real.startsWith(this.realRoot + "/")) {
      throw new VolumeError("volume.bad_path", `${vp} leads outside the volume (through a symlink)`, { path: vp });
    }
  }

  private lstat(abs: string, vp: string): Stats {
    const st = this.tryLstat(abs);
    if (!st) throw new VolumeError("volume.path_not_found", `${vp} does not exist`, { path: vp });
    return st;
  }

  private tryLstat(abs: string): Stats | undefined {
    try {
      return lstatSync(abs);
    } catch (e) {
      if (errorCode(e) === "ENOENT" || errorCode(e) === "ENOTDIR") return undefined;
      throw e;
    }
  }

  /** chown (never following a symlink) and chmod (skipped for symlinks); `created` applies the default owner. */
  private applyMeta(abs: string, vp: string, m: VolumeMetadata, created: boolean): VolumeEntry {
    const st = lstatSync(abs);
    const uid = m.uid ?? (created ? this.defaults.uid : -1);
    const gid = m.gid ?? (created ? this.defaults.gid : -1);
    try {
      if (uid !== -1 || gid !== -1) lchownSync(abs, uid, gid);
      if (m.mode !== undefined && !st.isSymbolicLink()) chmodSync(abs, m.mode & 0o7777);
    } catch (e) {
      throw this.ioError("set metadata of", vp, e);
    }
    return entryOf(lstatSync(abs), vp, abs);
  }

  private writable(): void {
    if (this.readOnly) throw new VolumeError("volume.read_only", "the volume is mounted read-only here", {});
  }

  private ioError(op: string, vp: string, e: unknown): VolumeError {
    const code = errorCode(e);
    if (code === "ENOENT") return new VolumeError("volume.path_not_found", `${vp} does not exist`, { path: vp });
    if (code === "EEXIST") return new VolumeError("volume.exists", `${vp} already exists`, { path: vp });
    if (code === "ENOTDIR") return new VolumeError("volume.not_a_directory", `a parent of ${vp} is not a directory`, { path: vp });
    return new VolumeError("volume.io_failed", `cannot ${op} ${vp}: ${errorMessage(e)}`, { path: vp, errno: code ?? null }, { cause: e });
  }
}
