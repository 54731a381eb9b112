/**
 * Guest kernel build: Debian's kernel source tarball + `make ARCH=x86_64 tinyconfig` + the
 * project fragment (`guest.config`), built as a PVH ELF `vmlinux` with everything built in.
 * Cached as `$home/kernels/<key>/vmlinux`, where key = sha256(source version, fragment)[0..16].
 * Facts (tinyconfig + fragment, `ARCH=x86_64`, PVH note type 0x12): docs/guest-kernel.md.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync, copyFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { logger } from "../../observability/log.ts";
import { withBuildLock } from "../buildlock.ts";
import { VmmError } from "../errors.ts";
import fragmentText from "./guest.config" with { type: "text" };
import { renameDurable } from "../../util/durable.ts";

const log = logger("vmm.kernel");

/** Where the kernel source comes from and where the result is cached. */
export interface KernelBuildOptions {
  /** Data directory; the kernel lands in `<homePath>/kernels/<key>/vmlinux`. */
  homePath: string;
  /** Debian `linux-source-*` tarball, e.g. /usr/src/linux-source-6.1.tar.xz. */
  sourceTarball: string;
  /** Debian package that ships the tarball; its version enters the cache key. */
  sourcePackage: string;
  /** `make -j` value; 0 means the number of CPUs. */
  jobs: number;
  /** Called with (done, total) compile steps; total is an estimate. */
  onProgress?: (done: number, total: number, line: string) => void;
}

/** A built (or cached) guest kernel. */
export interface KernelArtifact {
  /** Absolute path of the PVH ELF vmlinux. */
  path: string;
  /** Cache key: 16 hex chars of sha256(source version + fragment). */
  key: string;
  sourceVersion: string;
  /** True when the build ran now, false when it came from the cache. */
  built: boolean;
}

/** The config fragment text shipped with the project. */
export function kernelFragment(): string {
  return fragmentText;
}

/**
 * Version string of the kernel source: the Debian package version when dpkg knows it,
 * else the tarball's size and mtime. @throws VmmError `vmm.kernel_source_missing`.
 */
export function kernelSourceVersion(sourceTarball: string, sourcePackage: string): string {
  if (!existsSync(sourceTarball)) {
    throw new VmmError("vmm.kernel_source_missing", `kernel source ${sourceTarball} not found (install ${sourcePackage})`, {
      sourceTarball,
      sourcePackage,
    });
  }
  const r = Bun.spawnSync(["dpkg-query", "-W", "-f=${Version}", sourcePackage]);
  const v = r.exitCode === 0 ? r.stdout.toString().trim() : "";
  if (v) return `${sourcePackage}=${v}`;
  const st = statSync(sourceTarball);
  return `${sourceTarball}:${st.size}:${st.mtimeMs}`;
}

/** Cache key of a (source version, fragment) pair: 16 hex chars of sha256. */
export function kernelCacheKey(sourceVersion: string, fragment: string): string {
  return createHash("sha256").update(sourceVersion).update("\0").update(fragment).digest("hex").slice(0, 16);
}

/** Path the kernel for this key is cached at (it may not exist yet). */
export function kernelCachePath(homePath: string, key: string): string {
  return join(homePath, "kernels", key, "vmlinux");
}

/**
 * True when `path` is an ELF64 file carrying the Xen PVH entry note (type 0x12), which is what
 * QEMU `-kernel` and Firecracker need to boot an uncompressed vmlinux. Uses `readelf -n`.
 */
export function hasPvhNote(path: string): boolean {
  const head = readFileSync(path).subarray(0, 5);
  if (head[0] !== 0x7f || head[1] !== 0x45 || head[2] !== 0x4c || head[3] !== 0x46 || head[4] !== 2) return false;
  const r = Bun.spawnSync(["readelf", "-n", path]);
  return r.exitCode === 0 && /Xen\s+0x[0-9a-f]+\s+(Unknown note type: \(0x00000012\)|.*0x00000012)/i.test(r.stdout.toString());
}

/**
 * Lines of `fragment` whose value did not survive `olddefconfig` in `dotConfig` (each as
 * "KEY=want -> got"). Empty when every setting stuck.
 */
export function fragmentMismatches(fragment: string, dotConfig: string): string[] {
  const have = new Map<string, string>();
  for (const line of dotConfig.split("\n")) {
    const set = /^(CONFIG_\w+)=(.*)$/.exec(line);
    if (set) have.set(set[1]!, set[2]!);
    const unset = /^# (CONFIG_\w+) is not set$/.exec(line);
    if (unset) have.set(unset[1]!, "n");
  }
  const out: string[] = [];
  for (const line of fragment.split("\n")) {
    const set = /^(CONFIG_\w+)=(.*)$/.exec(line);
    const unset = /^# (CONFIG_\w+) is not set$/.exec(line);
    const key = set?.[1] ?? unset?.[1];
    if (!key) continue;
    const want = set ? set[2]! : "n";
    const got = have.get(key) ?? "n";
    if (got !== want) out.push(`${key}=${want} -> ${got}`);
  }
  return out;
}

async function run(cmd: string[], cwd: string, onLine?: (l: string) => void): Promise<string> {
  return await new Promise((resolve, reject) => {
    const p = spawn(cmd[0]!, cmd.slice(1), { cwd, stdio: ["ignore", "pipe", "pipe"] });
    let tail = "";
    let buf = "";
    const take = (d: Buffer) => {
      const s = d.toString();
      tail = (tail + s).slice(-4000);
      if (!onLine) return;
      buf += s;
      const lines = buf.split("\n");
      buf = lines.pop()!;
      for (const l of lines) onLine(l);
    };
    p.stdout.on("data", take);
    p.stderr.on("data", take);
    p.on("error", (e) => reject(new VmmError("vmm.kernel_build_failed", `cannot run ${cmd[0]}: ${e.message}`, { cmd, cwd })));
    p.on("close", (code) => {
      if (code === 0) resolve(tail);
      else reject(new VmmError("vmm.kernel_build_failed", `${cmd.join(" ")} exited ${code}: ${tail.slice(-1500)}`, { cmd, cwd, code }));
    });
  });
}

/** Rough number of compile steps of this config (used only for the progress bar). */
const ESTIMATED_STEPS = 1650;

/**
 * Build the guest kernel unless the cache already has it. Unpacks the tarball into a scratch
 * directory under `$home/kernels/`, runs tinyconfig + fragment, checks every fragment line
 * stuck, runs `make vmlinux`, checks the PVH note, moves the result into the cache and removes
 * the scratch tree. About 5 minutes on 2 cores. One build per host at a time
 * (`$home/kernels/.build.lock`; a second caller waits, then finds the result cached).
 * @throws VmmError `vmm.kernel_source_missing`, `vmm.kernel_config_mismatch`,
 *   `vmm.kernel_build_failed`, `vmm.kernel_not_pvh`.
 */
export async function buildKernel(opts: KernelBuildOptions): Promise<KernelArtifact> {
  const fragment = kernelFragment();
  const sourceVersion = kernelSourceVersion(opts.sourceTarball, opts.sourcePackage);
  const key = kernelCacheKey(sourceVersion, fragment);
  const out = kernelCachePath(opts.homePath, key);
  if (existsSync(out)) return { path: out, key, sourceVersion, built: false };
  const root = join(opts.homePath, "kernels");
  return await withBuildLock(join(root, ".build.lock"), 3_600_000, async () => {
    // another process may have finished this build while we waited
    if (existsSync(out)) return { path: out, key, sourceVersion, built: false };
    return await build(opts, fragment, sourceVersion, key, root, out);
  }, (pid) => log.info({ pid }, "waiting for another kernel build"));
}

async function build(opts: KernelBuildOptions, fragment: string, sourceVersion: string, key: string, root: string, out: string): Promise<KernelArtifact> {
  const scratch = join(root, `.build-${key}-${process.pid}`);
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  const t0 = performance.now();
  try {
    log.info({ key, sourceVersion, scratch }, "unpacking kernel source");
    await run(["tar", "-xf", opts.sourceTarball, "-C", scratch, "--strip-components=1"], scratch);
    writeFileSync(join(scratch, "arch/x86/configs/agentenv-guest.config"), fragment);
    await run(["make", "ARCH=x86_64", "tinyconfig"], scratch);
    await run(["make", "ARCH=x86_64", "agentenv-guest.config"], scratch);
    const bad = fragmentMismatches(fragment, readFileSync(join(scratch, ".config"), "utf8"));
    if (bad.length) {
      throw new VmmError("vmm.kernel_config_mismatch", `kernel config fragment lines did not survive olddefconfig: ${bad.join(", ")}`, {
        mismatches: bad,
        sourceVersion,
      });
    }
    const jobs = opts.jobs > 0 ? opts.jobs : cpus().length;
    let done = 0;
    await run(["make", "ARCH=x86_64", `-j${jobs}`, "vmlinux"], scratch, (line) => {
      if (/^\s+(CC|AS|LD|AR)\s/.test(line)) {
        done++;
        opts.onProgress?.(done, Math.max(done, ESTIMATED_STEPS), line.trim());
      }
    });
    const built = join(scratch, "vmlinux");
    if (!hasPvhNote(built)) throw new VmmError("vmm.kernel_not_pvh", `built ${built} has no PVH entry note`, { path: built });
    mkdirSync(join(root, key), { recursive: true });
    copyFileSync(built, `${out}.tmp`);
    copyFileSync(join(scratch, ".config"), join(root, key, "config"));
    writeFileSync(
      join(root, key, "meta.json"),
      JSON.stringify({ key, sourceVersion, builtAt: new Date().toISOString(), buildMs: Math.round(performance.now() - t0) }, null, 2),
    );
    renameDurable(`${out}.tmp`, out);
    log.info({ key, path: out, ms: Math.round(performance.now() - t0) }, "kernel built");
    return { path: out, key, sourceVersion, built: true };
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}
