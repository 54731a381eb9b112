/**
 * The CLI's template build client: the same calls the E2B SDK makes (POST /v3/templates, files
 * upload for each COPY, POST /v2/.../builds, status polled with logsOffset), with build logs
 * streamed to stderr as they come. A COPY source is what it names inside the build context and
 * nothing else: a path, or a glob's matches (Bun.Glob, dot files included), a directory with
 * everything under it, never a path outside the context or through a link leading out of it,
 * minus what `.dockerignore` excludes (Docker's rules: a pattern excludes a path or a directory
 * above it, `!` includes again, the last match wins). Exactly those entries are packed (tar
 * --no-recursion) and hashed: "COPY src dest", then per entry (sorted) its path, mode, size and
 * bytes or link target (not owners or times), so unchanged files are not uploaded again and the
 * step stays cached.
 */
import { createHash } from "node:crypto";
import { existsSync, lstatSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join, posix, relative, sep } from "node:path";
import type { BuildStep } from "../template/index.ts";
import { call, CliError, type Conn } from "./node-client.ts";

/** A build to run on the node. */
export interface CliBuild {
  /** `name[:tag]`. */
  name: string;
  fromImage?: string;
  /** A Dockerfile's FROM: the node decides whether it names one of its templates or an image. */
  from?: string;
  /** Registry credentials for `fromImage`. */
  registry?: { username: string; password: string };
  steps: BuildStep[];
  startCmd: string;
  readyCmd: string;
  /** Directory COPY sources are relative to. */
  contextDir: string;
  cpuCount?: number;
  memoryMB?: number;
  force: boolean;
}

/** `.dockerignore` patterns of `contextDir` (comments and blank lines dropped; none when absent). */
export function readDockerignore(contextDir: string): string[] {
  const p = join(contextDir, ".dockerignore");
  if (!existsSync(p)) return [];
  return readFileSync(p, "utf8")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith("#"));
}

/** Whether `.dockerignore` `patterns` exclude `rel` (posix, relative to the context). */
export function ignored(rel: string, patterns: string[]): boolean {
  let out = false;
  const parts = rel.split("/");
  for (const raw of patterns) {
    const neg = raw.startsWith("!");
    const pat = posix.normalize((neg ? raw.slice(1) : raw).trim()).replace(/^\/+|\/+$/g, "");
    if (!pat || pat === ".") continue;
    const glob = new Bun.Glob(pat);
    // a pattern matching a directory above the path excludes (or includes) it too
    for (let i = 1; i <= parts.length; i++) {
      if (glob.match(parts.slice(0, i).join("/"))) {
        out = !neg;
        break;
      }
    }
  }
  return out;
}

/**
 * Entries of the context a COPY `src` names, posix paths relative to the context, sorted:
 * a path or a glob's matches, directories with everything under them (links are entries, never
 * followed), minus `.dockerignore`'s exclusions.
 * @throws CliError when `src` leaves the context (`..`, absolute, or through a link) or matches nothing.
 */
export function copyEntries(contextDir: string, src: string, ignore: string[]): string[] {
  const norm = posix.normalize(src.replace(/^\.\/+/, ""));
  if (isAbsolute(src) || norm === ".." || norm.startsWith("../")) throw new CliError(`COPY ${src}: outside the build context ${contextDir}`);
  const ctxReal = realpathSync(contextDir);
  const inside = (rel: string) => {
    // every directory on the way must be inside the context (a link on the path could lead out)
    let dir: string;
    try {
      dir = realpathSync(dirname(join(contextDir, rel)));
    } catch {
      return false;
    }
    return dir === ctxReal || dir.startsWith(ctxReal + sep);
  };
  const base = norm.replace(/\/+$/, "") || ".";
  const roots = /[*?[{]/.test(base) ? [...new Bun.Glob(base).scanSync({ cwd: contextDir, dot: true, onlyFiles: false, followSymlinks: false })] : [base];
  const out = new Set<string>();
  const visit = (rel: string) => {
    if (rel !== "." && ignored(rel, ignore)) return;
    if (!inside(rel)) throw new CliError(`COPY ${src}: ${rel} is reached through a link leading out of the build context ${contextDir}`);
    let st;
    try {
      st = lstatSync(join(contextDir, rel));
    } catch {
      return;
    }
    if (rel !== ".") out.add(rel);
    if (st.isDirectory()) for (const e of readdirSync(join(contextDir, rel)).sort()) visit(rel === "." ? e : `${rel}/${e}`);
  };
  for (const r of roots.sort()) visit(r.split(sep).join("/"));
  if (out.size === 0) throw new CliError(`COPY ${src}: matches nothing in the build context ${contextDir}${ignore.length ? " (after .dockerignore)" : ""}`);
  return [...out].sort();
}

/** Hash of a COPY step's files: "COPY src dest", then per entry (sorted): path, mode, size, bytes or link target. */
export function filesHash(contextDir: string, src: string, dest: string, ignore = readDockerignore(contextDir)): string {
  const h = createHash("sha256").update(`COPY ${src} ${dest}`);
  for (const rel of copyEntries(contextDir, src, ignore)) {
    const p = join(contextDir, rel);
    const s = lstatSync(p);
    h.update(rel).update(String(s.mode)).update(String(s.isDirectory() ? 0 : s.size));
    if (s.isSymbolicLink()) h.update(readlinkSync(p));
    else if (s.isFile()) h.update(readFileSync(p));
  }
  return h.digest("hex");
}

/** Pack exactly the entries of `src` (see copyEntries) as a gzip tar, paths relative to the context. @returns its path. */
export function packCopy(contextDir: string, src: string): { path: string; cleanup: () => void } {
  const entries = copyEntries(contextDir, src, readDockerignore(contextDir));
  const dir = mkdtempSync(join(tmpdir(), "aenv-copy-"));
  const path = join(dir, "files.tar.gz");
  const list = join(dir, "entries");
  writeFileSync(list, entries.join("\0") + "\0");
  const r = Bun.spawnSync(["tar", "-czf", path, "-C", contextDir, "--no-recursion", "--null", "--verbatim-files-from", "-T", list], { stderr: "pipe" });
  if (r.exitCode !== 0) {
    rmSync(dir, { recursive: true, force: true });
    throw new CliError(`packing ${src} failed: ${r.stderr.toString().trim()}`);
  }
  return { path, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

interface StatusBody {
  status: "waiting" | "building" | "ready" | "error";
  logEntries: { timestamp: string; level: string; message: string; step?: string }[];
  reason?: { message: string; step?: string };
}

/**
 * Run `b` on the node; log lines go to `onLog` as they come.
 * @returns the template and build ids once the build is ready.
 * @throws CliError with the build's reason when it ends in `error`, or for a refused request.
 */
export async function buildOnNode(c: Conn, b: CliBuild, onLog: (line: string) => void): Promise<{ templateID: string; buildID: string }> {
  const reg = (await call(c, "POST", "/v3/templates", { name: b.name, ...(b.cpuCount ? { cpuCount: b.cpuCount } : {}), ...(b.memoryMB ? { memoryMB: b.memoryMB } : {}) })).data as {
    templateID: string;
    buildID: string;
  };
  const copies = b.steps.filter((s) => (s.type === "COPY" || s.type === "ADD") && s.filesHash);
  for (const s of copies) {
    const up = (await call(c, "GET", `/templates/${reg.templateID}/files/${s.filesHash}`)).data as { present: boolean; url: string };
    if (up.present) {
      onLog(`files of COPY ${s.args[0]} already on the node`);
      continue;
    }
    const packed = packCopy(b.contextDir, s.args[0]!);
    try {
      const size = lstatSync(packed.path).size;
      onLog(`uploading COPY ${s.args[0]} (${(size / 1024).toFixed(1)} KiB)`);
      const r = await fetch(up.url, { method: "PUT", body: Bun.file(packed.path), headers: { "content-length": String(size) } });
      if (!r.ok) throw new CliError(`upload of ${s.args[0]} failed: ${r.status} ${await r.text()}`);
    } finally {
      packed.cleanup();
    }
  }
  await call(c, "POST", `/v2/templates/${reg.templateID}/builds/${reg.buildID}`, {
    ...(b.fromImage ? { fromImage: b.fromImage } : {}),
    ...(b.from ? { from: b.from } : {}),
    ...(b.registry ? { fromImageRegistry: { type: "registry", ...b.registry } } : {}),
    steps: b.steps,
    startCmd: b.startCmd || undefined,
    readyCmd: b.readyCmd || undefined,
    force: b.force,
  });
  let offset = 0;
  for (;;) {
    const st = (await call(c, "GET", `/templates/${reg.templateID}/builds/${reg.buildID}/status?logsOffset=${offset}`)).data as StatusBody;
    offset += st.logEntries.length;
    for (const e of st.logEntries) onLog(`${e.level === "error" ? "ERROR " : ""}${e.message}`);
    if ((st.status === "ready" || st.status === "error") && st.logEntries.length === 0) {
      if (st.status === "error") throw new CliError(`build failed${st.reason?.step ? ` at step ${st.reason.step}` : ""}: ${st.reason?.message ?? "unknown reason"}`);
      return reg;
    }
    if (st.logEntries.length === 0) await Bun.sleep(250);
  }
}
