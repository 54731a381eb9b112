/**
 * `agentenv tools build`: the read-only tools drive every VM boots through (see ./boot.ts). One
 * ext4 image (no journal: it is never written) holding
 *   /init               the guest init (./init.sh), run by the kernel from this drive
 *   /bin/busybox        Debian's static busybox, and a link per applet (the init's commands and a
 *                       fallback userland at the end of the guest's PATH)
 *   /bin/agentenv       the compiled agentenv binary (envd), its PT_INTERP pointed at /.aenv/lib/ld.so
 *   /bin/<program>      host programs named in `[tools] binaries` (ss, curl), interpreter and
 *                       library path (DT_RPATH) rewritten by Debian's patchelf
 *   /lib/               the glibc loader (also as ld.so) and every shared library those need
 *   /etc/envd.json      the node's `[envd]` settings, which envd reads instead of a config file
 *   /etc/envd.env       `[envd] jsc_options` as BUN_JSC_<name>=<value> lines and `runtime_env`,
 *                       set by the init for envd's runtime only (see `jscEnvLines`)
 *   /dev /proc /sys /newroot   mount points of the init's first stage
 *   /.aenv              a link to `.`: the drive's own paths (/.aenv/bin, /.aenv/lib/ld.so) before
 *                       the root filesystem is mounted (a boot snapshot, see ./init.sh)
 * so a root filesystem needs nothing of its own: no glibc, no shell, not even /etc.
 *
 * Images are immutable and keyed by their inputs: `$home/tools/<key>/tools.ext4`. A VM (or a
 * snapshot of one) keeps using the image it booted with; `$home/tools/current` names the newest
 * build, which new VMs get (`resolveTools`).
 */
import { createHash } from "node:crypto";
import { chmodSync, copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { basename, join, relative } from "node:path";
import { compileEntrypoints } from "../bundle.ts";
import { logger } from "../observability/log.ts";
import { withBuildLock } from "../vmm/buildlock.ts";
import { TOOLS_INTERPRETER } from "./boot.ts";
import { setInterpreter } from "./elf.ts";
import { ToolsError } from "./errors.ts";
import initScript from "./init.sh" with { type: "text" };
import { renameDurable, writeFileDurable } from "../util/durable.ts";
import { errorMessage } from "../util/error.ts";

const log = logger("tools");

/** Bump when the drive's layout changes in a way its inputs do not show. */
const LAYOUT_VERSION = "tools-v2";
/** File name of the image inside `$home/tools/<key>/`. */
export const TOOLS_IMAGE = "tools.ext4";

/** Inputs of a tools drive build (`[tools]` in the config). */
export interface ToolsBuildOptions {
  homePath: string;
  /** Static busybox on the host (Debian busybox-static: /bin/busybox). */
  busybox: string;
  /** Dynamically linked host programs to carry with their libraries (e.g. /usr/bin/ss). */
  binaries: string[];
  /** The node's `[envd]` config section, given to the guest's envd (`agentenv envd --settings`). */
  envd: Record<string, unknown>;
  /** Phase progress: a short phase name and a detail line. */
  onProgress?: (phase: string, detail: string) => void;
}

/** A built tools drive. */
export interface ToolsImage {
  /** Absolute path of the ext4 image. */
  path: string;
  /** 16 hex chars of the hash of every input. */
  key: string;
}

/** The guest init script on the tools drive. */
export function toolsInitScript(): string {
  return initScript;
}

/**
 * The environment `bun build --compile` runs with: the caller's, without NODE_ENV. bun inlines
 * `process.env.NODE_ENV` at build time, so a drive built under `bun test` (NODE_ENV=test) would
 * ship an agentenv that behaves as in tests wherever it runs (e.g. logs at warn, dropping info
 * lines); without it the binary is the one `bun run build` makes.
 */
export function compileEnv(env: Record<string, string | undefined> = process.env): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (k !== "NODE_ENV" && v !== undefined) out[k] = v;
  return out;
}

async function run(cmd: string[], onLine?: (l: string) => void, env?: Record<string, string>): Promise<string> {
  let p;
  try {
    p = Bun.spawn(cmd, { stdout: "pipe", stderr: "pipe", ...(env ? { env } : {}) });
  } catch (e) {
    throw new ToolsError("tools.build_failed", `cannot run ${cmd[0]}: ${errorMessage(e)}`, { cmd: cmd.slice(0, 3) });
  }
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  for (const l of (out + err).split("\n")) if (l.trim()) onLine?.(l.trim());
  if (code !== 0) throw new ToolsError("tools.build_failed", `${cmd.join(" ").slice(0, 200)} exited ${code}: ${(err || out).slice(-1500)}`, { cmd: cmd.slice(0, 3), code });
  return out;
}

/**
 * `/etc/envd.env` of the drive: each `name=value` of `[envd] jsc_options` (space separated, checked
 * by the config schema: no spaces or shell characters) as a `BUN_JSC_<name>=<value>` line, the
 * variables through which Bun sets JavaScriptCore options at start, then each `NAME=VALUE` of
 * `runtime` (`[envd] runtime_env`, same rules) as it is. Empty options: an empty file.
 */
export function jscEnvLines(options: string, runtime = ""): string {
  const words = (s: string) => s.split(" ").filter(Boolean);
  return [...words(options).map((o) => `BUN_JSC_${o}\n`), ...words(runtime).map((o) => `${o}\n`)].join("");
}

/** Where the guest's agentenv binary comes from, and a key that changes when it would. */
export function agentenvSource(): { key: string; build: (out: string) => Promise<void> } {
  // Running as a `bun build --compile` binary: ship ourselves.
  if (Bun.main.startsWith("/$bunfs/")) {
    const self = process.execPath;
    const st = statSync(self);
    return { key: `exe:${self}:${st.size}:${st.mtimeMs}`, build: async (out) => copyFileSync(self, out) };
  }
  const root = join(import.meta.dir, "../..");
  const h = createHash("sha256");
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) h.update(relative(root, p)).update(readFileSync(p));
    }
  };
  for (const d of ["src", "services"]) if (existsSync(join(root, d))) walk(join(root, d));
  for (const f of ["package.json", "bun.lock", "config/default.toml"]) if (existsSync(join(root, f))) h.update(f).update(readFileSync(join(root, f)));
  return {
    key: `src:${h.digest("hex")}`,
    // --bytecode: precompiled JS, much faster start (envd boot time under TCG); it needs a module
    // graph without top-level await, so fall back to a plain compile if that ever changes
    build: async (out) => {
      // worker modules are extra entry points, or the binary would not embed them (src/bundle.ts)
      const args = ["build", "--compile", ...compileEntrypoints(), "--outfile", out];
      try {
        await run([process.execPath, ...args.slice(0, 2), "--bytecode", ...args.slice(2)], undefined, compileEnv());
      } catch (e) {
        log.warn({ err: errorMessage(e).slice(0, 500) }, "bytecode compile failed; compiling without --bytecode");
        await run([process.execPath, ...args], undefined, compileEnv());
      }
    },
  };
}

/** Shared libraries `ldd` resolves for `bin`: soname -> host path. */
async function sharedLibraries(bin: string): Promise<Map<string, string>> {
  const out = await run(["ldd", bin]);
  const libs = new Map<string, string>();
  for (const line of out.split("\n")) {
    const m = /^\s*(\S+)\s+=>\s+(\/\S+)\s+\(/.exec(line) ?? /^\s*(\/\S+)\s+\(/.exec(line);
    if (!m) continue;
    const path = m[2] ?? m[1]!;
    libs.set(basename(m[1]!), path);
  }
  return libs;
}

function fileHash(h: ReturnType<typeof createHash>, path: string): void {
  if (!existsSync(path)) throw new ToolsError("tools.missing_file", `${path} not found`, { path });
  h.update(path).update("\0").update(readFileSync(path)).update("\0");
}

/** The image `$home/tools/current` names. @throws ToolsError `tools.not_built`. */
export function resolveTools(homePath: string): ToolsImage {
  const pointer = join(homePath, "tools", "current");
  let key = "";
  try {
    key = readFileSync(pointer, "utf8").trim();
  } catch {
    // reported below
  }
  const path = join(homePath, "tools", key, TOOLS_IMAGE);
  if (!/^[0-9a-f]{16}$/.test(key) || !existsSync(path)) {
    throw new ToolsError("tools.not_built", `no tools drive in ${join(homePath, "tools")}: run 'agentenv tools build' (or 'agentenv template build-base')`, { homePath });
  }
  return { path, key };
}

/**
 * Build (or find cached) the tools drive for the current inputs and make it `current`.
 * @throws ToolsError `tools.missing_file` (busybox or a program absent), `tools.bad_elf`,
 *   `tools.build_failed` (ldd, patchelf, mkfs.ext4, the agentenv compile).
 */
export async function buildTools(opts: ToolsBuildOptions): Promise<{ image: ToolsImage; built: boolean }> {
  const root = join(opts.homePath, "tools");
  return await withBuildLock(join(root, ".build.lock"), 1_800_000, () => buildLocked(opts), (pid) => opts.onProgress?.("waiting", `another tools build (pid ${pid ?? "unknown"})`));
}

async function buildLocked(opts: ToolsBuildOptions): Promise<{ image: ToolsImage; built: boolean }> {
  const progress = opts.onProgress ?? (() => {});
  const root = join(opts.homePath, "tools");
  const agentenv = agentenvSource();
  // every file the drive carries enters the key
  const envdSettings = `${JSON.stringify(opts.envd, null, 2)}\n`;
  const h = createHash("sha256").update(LAYOUT_VERSION).update(initScript).update(agentenv.key).update(envdSettings);
  fileHash(h, opts.busybox);
  const programs = new Map<string, Map<string, string>>();
  for (const bin of opts.binaries) {
    fileHash(h, bin);
    const libs = await sharedLibraries(bin);
    programs.set(bin, libs);
    for (const p of [...libs.values()].sort()) fileHash(h, p);
  }
  // envd's own libraries: the host's glibc (the compiled binary links nothing else)
  const glibc = await sharedLibraries(process.execPath);
  for (const p of [...glibc.values()].sort()) fileHash(h, p);
  const key = h.digest("hex").slice(0, 16);
  const dir = join(root, key);
  const image: ToolsImage = { path: join(dir, TOOLS_IMAGE), key };
  if (existsSync(image.path)) {
    writeCurrent(root, key);
    progress("cached", `tools ${key}`);
    return { image, built: false };
  }

  const work = join(root, `.build-${process.pid}`);
  rmSync(work, { recursive: true, force: true });
  const tree = join(work, "tree");
  try {
    // root: the home envd gives root's commands before the root filesystem is mounted
    for (const d of ["bin", "lib", "etc", "dev", "proc", "sys", "newroot", "root"]) mkdirSync(join(tree, d), { recursive: true });
    // /.aenv names the drive's root wherever it is mounted: before the root filesystem is (a boot
    // snapshot's envd, started by `aenv.boot=wait`) the paths below /.aenv resolve as after
    symlinkSync(".", join(tree, ".aenv"));
    writeFileSync(join(tree, "init"), initScript);
    writeFileSync(join(tree, "etc/envd.json"), envdSettings);
    writeFileSync(join(tree, "etc/envd.env"), jscEnvLines(String(opts.envd.jsc_options ?? ""), String(opts.envd.runtime_env ?? "")));
    chmodSync(join(tree, "init"), 0o755);

    progress("busybox", opts.busybox);
    copyFileSync(opts.busybox, join(tree, "bin/busybox"));
    chmodSync(join(tree, "bin/busybox"), 0o755);
    const applets = (await run([opts.busybox, "--list"])).split("\n").map((a) => a.trim()).filter((a) => /^[A-Za-z0-9_.[\]-]+$/.test(a) && a !== "busybox");
    for (const a of applets) symlinkSync("busybox", join(tree, "bin", a));

    const libs = new Map<string, string>();
    for (const [soname, path] of glibc) libs.set(soname, path);
    progress("agentenv", "compiling the guest binary");
    const envd = join(tree, "bin/agentenv");
    await agentenv.build(envd);
    chmodSync(envd, 0o755);
    setInterpreter(envd, TOOLS_INTERPRETER);

    for (const [bin, needed] of programs) {
      const name = basename(bin);
      progress("program", bin);
      rmSync(join(tree, "bin", name), { force: true }); // a busybox applet of the same name yields
      const out = join(tree, "bin", name);
      copyFileSync(realpathSync(bin), out);
      chmodSync(out, 0o755);
      // DT_RPATH (not RUNPATH): it also serves the libraries' own dependencies
      await run(["patchelf", "--set-interpreter", TOOLS_INTERPRETER, "--force-rpath", "--set-rpath", "/.aenv/lib", out]);
      for (const [soname, path] of needed) libs.set(soname, path);
    }
    let loader = "";
    for (const [soname, path] of libs) {
      copyFileSync(realpathSync(path), join(tree, "lib", soname));
      if (soname.startsWith("ld-linux")) loader = soname;
    }
    if (!loader) throw new ToolsError("tools.missing_file", "no glibc loader (ld-linux*) among the libraries ldd reported", { libs: [...libs.keys()] });
    symlinkSync(loader, join(tree, "lib", "ld.so"));

    const bytes = Number((await run(["du", "-sb", tree])).split(/\s/)[0]);
    const sizeMiB = Math.ceil((bytes * 1.1) / 1048576) + 8;
    progress("mkfs", `ext4 ${sizeMiB} MiB (read-only, no journal)`);
    const tmp = join(work, TOOLS_IMAGE);
    writeFileSync(tmp, "");
    await run(["truncate", "-s", `${sizeMiB}M`, tmp]);
    await run(["mkfs.ext4", "-q", "-F", "-L", "aenv-tools", "-O", "^has_journal", "-E", "root_owner=0:0", "-d", tree, tmp]);
    mkdirSync(dir, { recursive: true });
    renameDurable(tmp, image.path);
    writeFileSync(join(dir, "tools.json"), `${JSON.stringify({ key, createdAt: new Date().toISOString(), busybox: opts.busybox, binaries: opts.binaries, libraries: [...libs.keys()].sort(), agentenv: agentenv.key }, null, 2)}\n`);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  writeCurrent(root, key);
  progress("done", `tools ${key}`);
  log.info({ key, path: image.path }, "tools drive built");
  return { image, built: true };
}

function writeCurrent(root: string, key: string): void {
  const pointer = join(root, "current");
  writeFileDurable(pointer, `${key}\n`);
}
