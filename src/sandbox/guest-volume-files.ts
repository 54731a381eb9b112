/**
 * The content API's file operations on a volume that a running sandbox mounts writable, done by
 * that sandbox's envd (the only safe way: its kernel owns the mounted ext4, so the node must not
 * mount the disk too). Metadata and directory work run as small root shell scripts (find -printf
 * for stat and listings, mkdir, chown, chmod, rm); file bytes go through envd's `/files` (a write
 * lands beside the target and is renamed over it, so a symlink at the target is replaced, never
 * followed). Every script checks with realpath that it stays inside the mount.
 */
import { basename, dirname } from "node:path";
import { VolumeError, volumePath, type VolumeEntry, type VolumeEntryType, type VolumeFiles, type VolumeMetadata, type VolumeWriteOptions } from "../volume/index.ts";
import type { CreateDefaults } from "../volume/index.ts";
import { execInGuest } from "./guest-exec.ts";

/** find -printf format of one entry: type, mode, uid, gid, size, atime, mtime, ctime, path, link target; NUL after each. */
const FMT = "%y\\0%m\\0%U\\0%G\\0%s\\0%A@\\0%T@\\0%C@\\0%p\\0%l\\0";
const FIELDS = 10;

/**
 * The guest-side script. $1 mount path, $2 operation, $3 guest path, then operation arguments.
 * Exit codes: 10 not found, 11 exists, 12 not a directory, 13 is a directory, 14 outside the
 * volume, 15 failed (stderr says why), 16 too many entries.
 */
export const FILES_SCRIPT = `
M=$1; op=$2; P=$3; shift 3
RM=$(realpath -e -- "$M") || exit 15
inside() { case "$1" in "$RM"|"$RM"/*) return 0;; esac; return 1; }
dir_ok() { [ "$P" = "$M" ] && return 0; r=$(realpath -e -- "$(dirname -- "$P")" 2>/dev/null) || exit 10; inside "$r" || exit 14; }
make_parents() {
  d=$(dirname -- "$P"); a=$d
  while [ ! -e "$a" ] && [ ! -L "$a" ]; do a=$(dirname -- "$a"); done
  r=$(realpath -e -- "$a" 2>/dev/null) || exit 10; inside "$r" || exit 14; [ -d "$r" ] || exit 12
  mkdir -p -- "$d" || exit 15
}
exists() { [ -e "$P" ] || [ -L "$P" ]; }
show() { find "$P" -maxdepth 0 -printf '${FMT}'; }
case $op in
stat) dir_ok; exists || exit 10; show ;;
list)
  r=$(realpath -e -- "$P" 2>/dev/null) || exit 10; inside "$r" || exit 14; [ -d "$r" ] || exit 12
  find "$P/" -mindepth 1 -maxdepth "$1" -printf '${FMT}' | head -z -n "$2" ;;
mkdir)
  if exists; then { [ "$1" = 1 ] && [ -d "$P" ] && [ ! -L "$P" ]; } || exit 11
  else
    if [ "$1" = 1 ]; then make_parents; fi
    dir_ok; [ -d "$(dirname -- "$P")" ] || exit 12
    mkdir -- "$P" || exit 15
  fi
  [ -n "$2" ] && { chown -h -- "$2" "$P" || exit 15; }
  [ -n "$3" ] && { chmod -- "$3" "$P" || exit 15; }
  show ;;
meta)
  dir_ok; exists || exit 10
  [ -n "$1" ] && { chown -h -- "$1" "$P" || exit 15; }
  [ -n "$2" ] && [ ! -L "$P" ] && { chmod -- "$2" "$P" || exit 15; }
  show ;;
rm) dir_ok; exists || exit 10; rm -rf -- "$P" || exit 15 ;;
prewrite)
  if [ "$1" = 1 ]; then make_parents; fi
  dir_ok; [ -d "$(dirname -- "$P")" ] || exit 10
  if [ -d "$P" ] && [ ! -L "$P" ]; then exit 13; fi ;;
postwrite)
  T=$1
  [ -n "$2" ] && { chown -h -- "$2" "$T" || exit 15; }
  [ -n "$3" ] && { chmod -- "$3" "$T" || exit 15; }
  mv -f -T -- "$T" "$P" || exit 15
  show ;;
read)
  r=$(realpath -e -- "$P" 2>/dev/null) || exit 10; inside "$r" || exit 14; [ -d "$r" ] && exit 13
  printf '%s\\0%s' "$(stat -c %s -- "$r")" "$r" ;;
esac
`;

const TYPES: Record<string, VolumeEntryType> = { f: "file", d: "directory", l: "symlink" };

/**
 * Parse find -printf output (NUL-separated fields, FIELDS per entry) into entries whose paths are
 * made volume-relative by cutting the mount path `mount` off (find prints `<mount>/<rel>`, or
 * `<mount>//<rel>` when started at `<mount>/`).
 */
export function parseFindEntries(out: string, mount: string): VolumeEntry[] {
  const f = out.split("\0");
  const entries: VolumeEntry[] = [];
  for (let i = 0; i + FIELDS <= f.length; i += FIELDS) {
    const [y, m, u, g, s, a, t, c, p, l] = f.slice(i, i + FIELDS) as [string, string, string, string, string, string, string, string, string, string];
    const vp = p === mount ? "/" : "/" + p.slice(mount.length).replace(/^\/+/, "");
    const type = TYPES[y] ?? "unknown";
    entries.push({
      name: vp === "/" ? "" : basename(vp),
      path: vp,
      type,
      size: Number(s),
      mode: parseInt(m, 8),
      uid: Number(u),
      gid: Number(g),
      atime: Math.round(Number(a) * 1000),
      mtime: Math.round(Number(t) * 1000),
      ctime: Math.round(Number(c) * 1000),
      ...(type === "symlink" ? { target: l } : {}),
    });
  }
  return entries;
}

/** chown spec for uid/gid ("u:g", "u", ":g") or "" when neither is given. */
function owner(uid: number | undefined, gid: number | undefined): string {
  if (uid !== undefined && gid !== undefined) return `${uid}:${gid}`;
  if (uid !== undefined) return String(uid);
  if (gid !== undefined) return `:${gid}`;
  return "";
}

const octal = (mode: number | undefined) => (mode === undefined ? "" : (mode & 0o7777).toString(8));

/** `VolumeFiles` through the envd of a sandbox that mounts the volume at `mount`. */
export class GuestVolumeFiles implements VolumeFiles {
  constructor(
    /** envd base URL, `http://host:port`. */
    private readonly base: string,
    private readonly token: string | null,
    private readonly mount: string,
    private readonly defaults: CreateDefaults,
    private readonly maxEntries: number,
    private readonly timeoutMs: number,
  ) {}

  async list(path: string, depth: number): Promise<VolumeEntry[]> {
    const vp = volumePath(path);
    const out = await this.script("list", vp, [String(depth), String((this.maxEntries + 1) * FIELDS)]);
    const entries = parseFindEntries(out, this.mount);
    if (entries.length > this.maxEntries) {
      throw new VolumeError("volume.too_many_entries", `${vp} holds more than ${this.maxEntries} entries within depth ${depth}`, { path: vp, limit: this.maxEntries });
    }
    return entries.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  }

  async stat(path: string): Promise<VolumeEntry> {
    const vp = volumePath(path);
    return this.one(await this.script("stat", vp, []), vp);
  }

  async makeDir(path: string, opts: VolumeWriteOptions): Promise<VolumeEntry> {
    const vp = volumePath(path);
    if (vp === "/") throw new VolumeError("volume.exists", "/ is the volume's root directory", { path: vp });
    // a new directory gets the default owner and mode; an existing one (force) only what is asked
    const created = await this.script("stat", vp, []).then(
      () => false,
      (e) => (e instanceof VolumeError && e.code === "volume.path_not_found" ? true : Promise.reject(e)),
    );
    const uid = opts.uid ?? (created ? this.defaults.uid : undefined);
    const gid = opts.gid ?? (created ? this.defaults.gid : undefined);
    const mode = opts.mode ?? (created ? this.defaults.dirMode : undefined);
    return this.one(await this.script("mkdir", vp, [opts.force ? "1" : "0", owner(uid, gid), octal(mode)]), vp);
  }

  async readFile(path: string): Promise<{ size: number; stream: ReadableStream<Uint8Array> }> {
    const vp = volumePath(path);
    const [size, real] = (await this.script("read", vp, [])).split("\0") as [string, string];
    const res = await fetch(`${this.base}/files?path=${encodeURIComponent(real)}&username=root`, { headers: this.headers() });
    if (!res.ok || !res.body) {
      const text = await res.text();
      if (res.status === 404) throw new VolumeError("volume.path_not_found", `${vp} does not exist`, { path: vp });
      throw new VolumeError("volume.io_failed", `reading ${vp} through envd failed: HTTP ${res.status} ${text.slice(0, 200)}`, { path: vp, status: res.status });
    }
    return { size: Number(size), stream: res.body };
  }

  async writeFile(path: string, body: ReadableStream<Uint8Array> | null, opts: VolumeWriteOptions): Promise<VolumeEntry> {
    const vp = volumePath(path);
    if (vp === "/") throw new VolumeError("volume.is_a_directory", "/ is the volume's root directory", { path: vp });
    await this.script("prewrite", vp, [opts.force ? "1" : "0"]);
    const tmpVp = `${dirname(vp) === "/" ? "" : dirname(vp)}/.aenv-upload-${Math.random().toString(36).slice(2)}`;
    const tmp = this.mount + tmpVp;
    const res = await fetch(`${this.base}/files?path=${encodeURIComponent(tmp)}&username=root`, {
      method: "POST",
      headers: { ...this.headers(), "content-type": "application/octet-stream" },
      body: body ?? new Uint8Array(0),
      duplex: "half",
    } as RequestInit);
    const text = await res.text();
    if (!res.ok) {
      await this.script("rm", tmpVp, []).catch(() => {});
      throw new VolumeError("volume.io_failed", `writing ${vp} through envd failed: HTTP ${res.status} ${text.slice(0, 200)}`, { path: vp, status: res.status });
    }
    const out = await this.script("postwrite", vp, [tmp, owner(opts.uid ?? this.defaults.uid, opts.gid ?? this.defaults.gid), octal(opts.mode ?? this.defaults.fileMode)]);
    return this.one(out, vp);
  }

  async remove(path: string): Promise<void> {
    const vp = volumePath(path);
    if (vp === "/") throw new VolumeError("volume.bad_path", "the volume's root directory cannot be removed", { path: vp });
    await this.script("rm", vp, []);
  }

  async setMetadata(path: string, meta: VolumeMetadata): Promise<VolumeEntry> {
    const vp = volumePath(path);
    return this.one(await this.script("meta", vp, [owner(meta.uid, meta.gid), octal(meta.mode)]), vp);
  }

  // ---- internals ----

  private headers(): Record<string, string> {
    return this.token ? { "x-access-token": this.token } : {};
  }

  private one(out: string, vp: string): VolumeEntry {
    const e = parseFindEntries(out, this.mount)[0];
    if (!e) throw new VolumeError("volume.io_failed", `no entry for ${vp} in the guest's answer`, { path: vp });
    return { ...e, path: vp, name: vp === "/" ? "" : basename(vp) };
  }

  /** Run one operation of FILES_SCRIPT on volume path `vp`; map its exit code to a VolumeError. */
  private async script(op: string, vp: string, args: string[]): Promise<string> {
    const guestPath = vp === "/" ? this.mount : this.mount + vp;
    const r = await execInGuest(this.base, this.token, "/bin/sh", ["-c", FILES_SCRIPT, "sh", this.mount, op, guestPath, ...args], this.timeoutMs, 64 << 20);
    const why = r.stderr.trim();
    switch (r.exitCode) {
      case 0:
        return r.stdout;
      case 10:
        throw new VolumeError("volume.path_not_found", `${vp} does not exist`, { path: vp });
      case 11:
        throw new VolumeError("volume.exists", `${vp} already exists`, { path: vp });
      case 12:
        throw new VolumeError("volume.not_a_directory", `${vp} is not a directory`, { path: vp });
      case 13:
        throw new VolumeError("volume.is_a_directory", `${vp} is a directory`, { path: vp });
      case 14:
        throw new VolumeError("volume.bad_path", `${vp} leads outside the volume (through a symlink)`, { path: vp });
      default:
        throw new VolumeError("volume.io_failed", `${op} of ${vp} in the guest failed (exit ${r.exitCode})${why ? `: ${why}` : ""}`, { path: vp, exitCode: r.exitCode });
    }
  }
}
