/**
 * `template build-base`: a Debian root filesystem made with mmdebstrap from the host's Debian
 * mirror, with a `user` account (uid 1000), written as a raw ext4 image and imported as one
 * overlaybd layer (`rootfs-<buildKey>-<random>.layer`: a rebuild adds a layer, never rewrites
 * one something stacks on) into the template store as `base`. The guest init and envd are
 * not in it: every VM boots through the tools drive (src/tools), which this build also makes
 * (or finds cached), so `build-base` leaves a node ready to boot sandboxes.
 * Two cache levels: the mmdebstrap tree (keyed by suite, mirror, packages) and the final image
 * (keyed by that and the size). mmdebstrap/mkfs facts: docs/vm-on-this-machine.md §8.
 */
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { logger } from "../observability/log.ts";
import { TemplateError } from "./errors.ts";
import { runTool } from "../image/index.ts";
import { importSparse } from "../storage/overlaybd/index.ts";
import { withBuildLock } from "../vmm/buildlock.ts";
import { buildTools, type ToolsBuildOptions, type ToolsImage } from "../tools/index.ts";
import { readManifest, templateDir, writeManifest, type TemplateManifest } from "./store.ts";
import { renameDurable } from "../util/durable.ts";

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
  /** Bound on each tool run (mmdebstrap, mkfs), ms (`[template] tool_timeout_ms`). */
  toolTimeoutMs: number;
  /** Template name (default "base"). */
  name?: string;
  /** The tools drive to build (or find cached) alongside (`[tools]`). */
  tools: Pick<ToolsBuildOptions, "busybox" | "binaries" | "envd">;
  /** Phase progress: a short phase name and a detail line. */
  onProgress?: (phase: string, detail: string) => void;
}

/** Result of a build: the manifest, whether anything was rebuilt, and the tools drive. */
export interface BaseBuildResult {
  manifest: TemplateManifest;
  built: boolean;
  tools: ToolsImage;
}

/**
 * Extra kernel arguments of templates built here: none (root device and init come from the
 * tools drive, src/tools/boot.ts).
 */
export const BASE_BOOT_ARGS = "";

/** Version of `trimLoginProfiles`' edits (part of the build key: a change rebuilds the image). */
const LOGIN_PROFILE_VERSION = "login-profile-v1";

/**
 * Take the forks out of the login profiles that need none. The E2B SDK runs every command as
 * `/bin/bash -l -c <cmd>`, so each one reads /etc/profile, whose Debian version asks
 * `"$(id -u)"` twice (one fork and exec of `id` each time it runs: 120-180 ms of a 260-310 ms
 * `bash -l -c true` in a TCG guest here, measured with the edit applied in a running sandbox),
 * and, as root, ~/.profile, which runs `mesg n` (an exec that only matters on a terminal).
 * Bash knows its effective uid as `$EUID`; `${EUID:-$(id -u)}` keeps dash and other login
 * shells (no EUID) asking `id`. `mesg n` runs only in interactive shells. Edits are idempotent.
 * @param tree the root filesystem directory
 * @returns the files changed (paths relative to `tree`)
 */
export function trimLoginProfiles(tree: string): string[] {
  const changed: string[] = [];
  const edit = (rel: string, f: (text: string) => string) => {
    const path = join(tree, rel);
    if (!existsSync(path)) return;
    const before = readFileSync(path, "utf8");
    const after = f(before);
    if (after !== before) {
      writeFileSync(path, after);
      changed.push(rel);
    }
  };
  edit("etc/profile", (t) => t.replaceAll('"$(id -u)"', '"${EUID:-$(id -u)}"'));
  edit("root/.profile", (t) => t.replace(/^mesg n 2> \/dev\/null \|\| true$/m, 'case $- in *i*) mesg n 2> /dev/null || true ;; esac'));
  return changed;
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

/**
 * Run a command (runTool); stream its output lines to `onLine`.
 * @throws TemplateError `template.tool_missing`, `template.build_failed` (non-zero exit, timeout).
 */
async function run(cmd: string[], timeoutMs: number, onLine?: (l: string) => void): Promise<void> {
  const r = await runTool(cmd, { timeoutMs, onLine, stdoutLines: true });
  if (r.code === 0) return;
  if (r.missing) throw new TemplateError("template.tool_missing", `cannot run ${cmd[0]}: ${r.stderr.trim()}`, { cmd: cmd[0] });
  const why = r.timedOut ? `took longer than ${timeoutMs} ms` : `exited ${r.code}`;
  throw new TemplateError("template.build_failed", `${cmd[0]} ${why}: ${`${r.stdout}\n${r.stderr}`.trim().slice(-1500)}`, { cmd: cmd.slice(0, 3), code: r.code });
}

/**
 * Build (or find cached) the base template. Idempotent: returns `built: false` without work
 * when every input is unchanged. Needs root (mmdebstrap --mode=root, file ownership in ext4).
 * @throws TemplateError `template.no_mirror`, `template.tool_missing`, `template.build_failed`.
 */
export async function buildBase(opts: BaseBuildOptions): Promise<BaseBuildResult> {
  const tools = await buildTools({ homePath: opts.homePath, ...opts.tools, onProgress: (phase, detail) => opts.onProgress?.(`tools ${phase}`, detail) });
  // one template build per host at a time: builds share the mmdebstrap cache tree
  const r = await withBuildLock(join(opts.homePath, "templates", ".build.lock"), 1_800_000, () => buildBaseLocked(opts), (pid) =>
    opts.onProgress?.("waiting", `another template build (pid ${pid ?? "unknown"})`),
  );
  return { ...r, tools: tools.image };
}

async function buildBaseLocked(opts: BaseBuildOptions): Promise<Omit<BaseBuildResult, "tools">> {
  const name = opts.name ?? "base";
  const progress = opts.onProgress ?? (() => {});
  const mirror = opts.mirror || hostDebianMirror(opts.suite);
  const packages = [...new Set(opts.packages)].sort();
  const debKey = sha("debian-v1", opts.suite, mirror, packages.join(","));
  const buildKey = sha(debKey, "tools-drive-v1", LOGIN_PROFILE_VERSION, String(opts.sizeMiB));
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
      opts.toolTimeoutMs,
      (l) => progress("mmdebstrap", l),
    );
    writeFileSync(join(tree, ".complete"), `${new Date().toISOString()}\n`);
  } else {
    progress("mmdebstrap", `cached ${debKey}`);
  }

  trimLoginProfiles(tree);
  // mmdebstrap leaves the build host's resolver here; the guest init writes the real one at boot
  writeFileSync(join(tree, "etc/resolv.conf"), "# written by the guest init at boot\n");
  // trees cached by earlier builds carried init and envd themselves; the tools drive does now
  for (const f of ["sbin/aenv-init", "usr/local/bin/agentenv"]) rmSync(join(tree, f), { force: true });
  // where the tools drive appears (the init makes it on a writable root; a read-only one needs it)
  mkdirSync(join(tree, ".aenv"), { recursive: true });

  progress("mkfs", `ext4 ${opts.sizeMiB} MiB`);
  mkdirSync(dir, { recursive: true });
  // half-written files of a build that crashed (under the build lock: no build is writing them)
  for (const f of readdirSync(dir)) if (f.endsWith(".tmp")) rmSync(join(dir, f), { force: true });
  const img = join(dir, "rootfs.ext4");
  const tmp = `${img}.tmp`;
  rmSync(tmp, { force: true });
  writeFileSync(tmp, "");
  truncateSync(tmp, opts.sizeMiB * 1048576);
  // skip the mmdebstrap marker file; -E root_owner keeps / owned by root
  const marker = join(tree, ".complete");
  const markerText = readFileSync(marker);
  rmSync(marker);
  try {
    await run(["mkfs.ext4", "-q", "-F", "-L", "aenv-root", "-E", "root_owner=0:0", "-d", tree, tmp], opts.toolTimeoutMs);
  } finally {
    writeFileSync(marker, markerText);
  }
  renameDurable(tmp, img);

  // a new name per build, never an existing file: templates built on this one and sandboxes
  // (running or paused) stack on the layer they started with, which a rebuild must not change
  const layerName = `rootfs-${buildKey}-${randomBytes(4).toString("hex")}.layer`;
  progress("overlaybd", `importing rootfs.ext4 as the overlaybd layer ${layerName}`);
  const layer = join(dir, layerName);
  await importSparse(img, `${layer}.tmp`);
  renameDurable(`${layer}.tmp`, layer);

  const manifest: TemplateManifest = {
    name,
    rootfs: "rootfs.ext4",
    layers: [layerName],
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
