/**
 * `template build-base`: a Debian root filesystem made with mmdebstrap from the host's Debian
 * mirror, plus our guest init (/sbin/aenv-init), the compiled `agentenv` binary (envd) and a
 * `user` account (uid 1000), written as a raw ext4 image and imported as one overlaybd layer
 * (`rootfs.layer`) into the template store as `base`.
 * Two cache levels: the mmdebstrap tree (keyed by suite, mirror, packages) and the final image
 * (keyed by that plus init, agentenv binary inputs and size). mmdebstrap/mkfs facts:
 * docs/vm-on-this-machine.md §8.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { logger } from "../observability/log.ts";
import { TemplateError } from "./errors.ts";
import { importSparse } from "../storage/overlaybd/index.ts";
import { withBuildLock } from "../vmm/buildlock.ts";
import { compileEntrypoints } from "../bundle.ts";
import { readManifest, templateDir, writeManifest, type TemplateManifest } from "./store.ts";
import initScript from "./guest/init.sh" with { type: "text" };

const log = logger("template");

/** Inputs of the base template build. */
export interface BaseBuildOptions {
  homePath: string;
  /** Debian suite, e.g. "bookworm". */
  suite: string;
  /** Debian mirror URL; empty picks the host's apt source (see `hostDebianMirror`). */
  mirror: string;
  /** Packages beyond minbase. */
  packages: string[];
  /** Root image size in MiB. */
  sizeMiB: number;
  /** Template name (default "base"). */
  name?: string;
  /** Phase progress: a short phase name and a detail line. */
  onProgress?: (phase: string, detail: string) => void;
}

/** Result of a build: the manifest and whether anything was rebuilt. */
export interface BaseBuildResult {
  manifest: TemplateManifest;
  built: boolean;
}

/** Kernel command line of templates built here: root disk is the first virtio-blk, read-write. */
export const BASE_BOOT_ARGS = "root=/dev/vda rw rootfstype=ext4 init=/sbin/aenv-init";

/** The guest init script shipped in every template. */
export function guestInitScript(): string {
  return initScript;
}

/**
 * First http(s) `deb` URI of this host's enabled apt sources (`/etc/apt/sources.list` and
 * `sources.list.d/*.list|*.sources`, one-line and deb822 formats) whose suite list contains
 * `suite`. @throws TemplateError `template.no_mirror`.
 */
export function hostDebianMirror(suite: string, aptDir = "/etc/apt"): string {
  const files: string[] = [];
  if (existsSync(join(aptDir, "sources.list"))) files.push(join(aptDir, "sources.list"));
  const d = join(aptDir, "sources.list.d");
  if (existsSync(d)) for (const f of readdirSync(d).sort()) if (f.endsWith(".list") || f.endsWith(".sources")) files.push(join(d, f));
  for (const f of files) {
    const text = readFileSync(f, "utf8");
    if (f.endsWith(".sources")) {
      for (const stanza of text.split(/\n\s*\n/)) {
        const field = (k: string) => new RegExp(`^${k}:\\s*(.+)$`, "mi").exec(stanza)?.[1]?.trim().split(/\s+/) ?? [];
        if (!field("Types").includes("deb") || !field("Suites").includes(suite)) continue;
        if (field("Enabled")[0] === "no") continue;
        const uri = field("URIs").find((u) => /^https?:\/\//.test(u));
        if (uri) return uri;
      }
    } else {
      for (const line of text.split("\n")) {
        const m = /^\s*deb\s+(?:\[[^\]]*\]\s+)?(https?:\/\/\S+)\s+(\S+)/.exec(line);
        if (m && m[2] === suite) return m[1]!;
      }
    }
  }
  throw new TemplateError("template.no_mirror", `no Debian mirror for ${suite} in ${aptDir}`, { suite, aptDir });
}

function sha(...parts: (string | Uint8Array)[]): string {
  const h = createHash("sha256");
  for (const p of parts) h.update(p).update("\0");
  return h.digest("hex").slice(0, 16);
}

/** Run a command; stream its output lines to `onLine`. @throws TemplateError `template.build_failed`. */
async function run(cmd: string[], onLine?: (l: string) => void, env?: Record<string, string>): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const p = spawn(cmd[0]!, cmd.slice(1), { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
    let tail = "";
    let buf = "";
    const take = (d: Buffer) => {
      const s = d.toString();
      tail = (tail + s).slice(-3000);
      buf += s;
      const lines = buf.split("\n");
      buf = lines.pop()!;
      for (const l of lines) onLine?.(l);
    };
    p.stdout.on("data", take);
    p.stderr.on("data", take);
    p.on("error", (e) => reject(new TemplateError("template.tool_missing", `cannot run ${cmd[0]}: ${e.message}`, { cmd: cmd[0] })));
    p.on("close", (code) =>
      code === 0
        ? resolve()
        : reject(new TemplateError("template.build_failed", `${cmd[0]} exited ${code}: ${tail.slice(-1500)}`, { cmd: cmd.slice(0, 3), code })),
    );
  });
}

/** Where the agentenv binary for the guest comes from, and a key that changes when it would. */
function agentenvSource(): { key: string; build: (out: string) => Promise<void> } {
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
  walk(join(root, "src"));
  for (const f of ["package.json", "bun.lock", "config/default.toml"]) if (existsSync(join(root, f))) h.update(f).update(readFileSync(join(root, f)));
  return {
    key: `src:${h.digest("hex")}`,
    // --bytecode: precompiled JS, about 10x faster start (envd boot time under TCG); it needs a
    // module graph without top-level await, so fall back to a plain compile if that ever changes
    build: async (out) => {
      // worker modules are extra entry points, or the binary would not embed them (src/bundle.ts)
      const args = ["build", "--compile", ...compileEntrypoints(), "--outfile", out];
      try {
        await run([process.execPath, ...args.slice(0, 2), "--bytecode", ...args.slice(2)]);
      } catch (e) {
        log.warn({ err: (e as Error).message.slice(0, 500) }, "bytecode compile failed; compiling without --bytecode");
        await run([process.execPath, ...args]);
      }
    },
  };
}

/**
 * Build (or find cached) the base template. Idempotent: returns `built: false` without work
 * when every input is unchanged. Needs root (mmdebstrap --mode=root, file ownership in ext4).
 * @throws TemplateError `template.no_mirror`, `template.tool_missing`, `template.build_failed`.
 */
export async function buildBase(opts: BaseBuildOptions): Promise<BaseBuildResult> {
  // one template build per host at a time: builds share the mmdebstrap cache tree
  return await withBuildLock(join(opts.homePath, "templates", ".build.lock"), 1_800_000, () => buildBaseLocked(opts), (pid) =>
    opts.onProgress?.("waiting", `another template build (pid ${pid})`),
  );
}

async function buildBaseLocked(opts: BaseBuildOptions): Promise<BaseBuildResult> {
  const name = opts.name ?? "base";
  const progress = opts.onProgress ?? (() => {});
  const mirror = opts.mirror || hostDebianMirror(opts.suite);
  const packages = [...new Set(opts.packages)].sort();
  const debKey = sha("debian-v1", opts.suite, mirror, packages.join(","));
  const agentenv = agentenvSource();
  const buildKey = sha(debKey, initScript, agentenv.key, String(opts.sizeMiB));
  const dir = templateDir(opts.homePath, name);
  try {
    const m = readManifest(opts.homePath, name);
    if (m.buildKey === buildKey && existsSync(join(dir, m.rootfs))) {
      progress("cached", `${name} ${buildKey}`);
      return { manifest: m, built: false };
    }
  } catch {
    // no usable manifest: build
  }

  const cacheRoot = join(opts.homePath, "templates", ".cache");
  const tree = join(cacheRoot, `debian-${debKey}`);
  if (!existsSync(join(tree, ".complete"))) {
    rmSync(tree, { recursive: true, force: true });
    mkdirSync(tree, { recursive: true });
    progress("mmdebstrap", `${opts.suite} from ${mirror} (+${packages.length} packages)`);
    const hooks = [
      // uid/gid 1000 `user` with passwordless sudo, as E2B templates have
      'chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash user',
      'mkdir -p "$1/etc/sudoers.d" && echo "user ALL=(ALL:ALL) NOPASSWD: ALL" > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"',
      'printf "127.0.0.1\\tlocalhost\\n::1\\tlocalhost ip6-localhost ip6-loopback\\n" > "$1/etc/hosts"',
      'rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*_Packages',
    ];
    await run(
      [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=directory",
        `--include=${packages.join(",")}`,
        ...hooks.map((h) => `--customize-hook=${h}`),
        opts.suite,
        tree,
        mirror,
      ],
      (l) => l.trim() && progress("mmdebstrap", l.trim()),
    );
    writeFileSync(join(tree, ".complete"), `${new Date().toISOString()}\n`);
  } else {
    progress("mmdebstrap", `cached ${debKey}`);
  }

  progress("agentenv", "compiling the guest binary");
  mkdirSync(join(tree, "usr/local/bin"), { recursive: true });
  await agentenv.build(join(tree, "usr/local/bin/agentenv"));
  chmodSync(join(tree, "usr/local/bin/agentenv"), 0o755);
  // mmdebstrap leaves the build host's resolver here; the guest init writes the real one at boot
  writeFileSync(join(tree, "etc/resolv.conf"), "# written by /sbin/aenv-init at boot\n");
  writeFileSync(join(tree, "sbin/aenv-init"), initScript);
  chmodSync(join(tree, "sbin/aenv-init"), 0o755);

  progress("mkfs", `ext4 ${opts.sizeMiB} MiB`);
  mkdirSync(dir, { recursive: true });
  const img = join(dir, "rootfs.ext4");
  const tmp = `${img}.tmp`;
  rmSync(tmp, { force: true });
  writeFileSync(tmp, "");
  await run(["truncate", "-s", `${opts.sizeMiB}M`, tmp]);
  // skip the mmdebstrap marker file; -E root_owner keeps / owned by root
  const marker = join(tree, ".complete");
  const markerText = readFileSync(marker);
  rmSync(marker);
  try {
    await run(["mkfs.ext4", "-q", "-F", "-L", "aenv-root", "-E", "root_owner=0:0", "-d", tree, tmp]);
  } finally {
    writeFileSync(marker, markerText);
  }
  renameSync(tmp, img);

  progress("overlaybd", "importing rootfs.ext4 as an overlaybd layer");
  const layer = join(dir, "rootfs.layer");
  rmSync(`${layer}.tmp`, { force: true });
  await importSparse(img, `${layer}.tmp`);
  renameSync(`${layer}.tmp`, layer);

  const manifest: TemplateManifest = {
    name,
    rootfs: "rootfs.ext4",
    layers: ["rootfs.layer"],
    bootArgs: BASE_BOOT_ARGS,
    diskBytes: opts.sizeMiB * 1024 * 1024,
    buildKey,
    createdAt: new Date().toISOString(),
  };
  writeManifest(opts.homePath, manifest);
  progress("done", `${name} ${buildKey}`);
  log.info({ name, buildKey, dir }, "base template built");
  return { manifest, built: true };
}


/** Where image templates carry envd's own glibc (loader + libraries), inside the guest. */
export const GUEST_LIB_DIR = "/opt/aenv/lib";
/** Where image templates carry a static busybox and its applet links (last on the guest's PATH). */
export const GUEST_BIN_DIR = "/opt/aenv/bin";

/**
 * The envd binary (`agentenv`) and init script that image-based templates get. The binary is
 * taken from the `base` template's root image (`debugfs dump`, so it matches what base
 * sandboxes run) and made independent of the image's userland: its ELF interpreter and run path
 * are set (Debian's `patchelf`) to `GUEST_LIB_DIR`, where the image gets the glibc loader and
 * libraries the binary needs (copied from this Debian host, the same release the base template
 * is built from). So images without glibc (Alpine, busybox) run envd. A static busybox from this
 * host (when installed) goes along, for images without a shell or tools (distroless). Cached as
 * `$home/images/guest-<key>/` (`agentenv`, `lib/`, `busybox`).
 * @returns the binary's path, the library directory, the init text, and a key that changes with any.
 * @throws TemplateError `template.not_found` when no base template with a raw image exists,
 *   `template.build_failed` when debugfs, ldd or patchelf fails, `template.tool_missing`.
 */
export function guestBinaries(homePath: string, baseName = "base"): { agentenvPath: string; libDir: string; busyboxPath?: string; init: string; key: string } {
  const m = readManifest(homePath, baseName);
  const img = join(templateDir(homePath, baseName), m.rootfs);
  if (!existsSync(img)) throw new TemplateError("template.not_found", `template ${baseName} has no root image ${img}: run 'agentenv template build-base' (image templates take envd from it)`, { img });
  // a static busybox (Debian's busybox-static) for images without a shell or tools; a dynamic
  // one would need the image's libc, so it is left out then
  const hostBusybox = Bun.which("busybox", { PATH: "/bin:/usr/bin:/sbin:/usr/sbin" });
  const staticBusybox = hostBusybox && Bun.spawnSync(["ldd", hostBusybox], { stdout: "pipe", stderr: "pipe" }).exitCode !== 0 ? hostBusybox : null;
  const key = sha(m.buildKey, initScript, GUEST_LIB_DIR, GUEST_BIN_DIR, staticBusybox ? String(statSync(staticBusybox).size) : "no-busybox", "guest-v3");
  const dir = join(homePath, "images", `guest-${key}`);
  const out = { agentenvPath: join(dir, "agentenv"), libDir: join(dir, "lib"), ...(staticBusybox ? { busyboxPath: join(dir, "busybox") } : {}), init: initScript, key };
  if (existsSync(join(dir, ".complete"))) return out;
  const tmp = `${dir}.${process.pid}.tmp`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(join(tmp, "lib"), { recursive: true });
  const step = (cmd: string[], what: string) => {
    const r = Bun.spawnSync(cmd, { stderr: "pipe", stdout: "pipe" });
    if (r.exitCode === null || r.exitCode !== 0) {
      rmSync(tmp, { recursive: true, force: true });
      if (r.exitCode === null) throw new TemplateError("template.tool_missing", `cannot run ${cmd[0]} (${what})`, { tool: cmd[0] });
      throw new TemplateError("template.build_failed", `${what} failed: ${r.stderr.toString().slice(-500)}`, { cmd: cmd.slice(0, 3) });
    }
    return r.stdout.toString();
  };
  const bin = join(tmp, "agentenv");
  step(["debugfs", "-R", `dump /usr/local/bin/agentenv ${bin}`, img], `extracting agentenv from ${img}`);
  if (!existsSync(bin) || statSync(bin).size === 0) {
    rmSync(tmp, { recursive: true, force: true });
    throw new TemplateError("template.build_failed", `${img} holds no /usr/local/bin/agentenv`, { img });
  }
  chmodSync(bin, 0o755);
  // the loader and every library ldd resolves for the binary (paths of this host)
  let loader = "";
  for (const line of step(["ldd", bin], "ldd agentenv").split("\n")) {
    const lib = /=>\s+(\/\S+)/.exec(line)?.[1] ?? /^\s*(\/\S+)\s+\(/.exec(line)?.[1];
    if (!lib) continue;
    const name = lib.split("/").pop()!;
    if (/^ld-linux/.test(name)) loader = name;
    copyFileSync(lib, join(tmp, "lib", name));
  }
  if (!loader) {
    rmSync(tmp, { recursive: true, force: true });
    throw new TemplateError("template.build_failed", "ldd named no ELF loader for agentenv", {});
  }
  step(["patchelf", "--set-interpreter", `${GUEST_LIB_DIR}/${loader}`, "--set-rpath", GUEST_LIB_DIR, bin], "patchelf agentenv");
  if (staticBusybox) copyFileSync(staticBusybox, join(tmp, "busybox"));
  writeFileSync(join(tmp, ".complete"), `${m.buildKey}\n`);
  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
  return out;
}
