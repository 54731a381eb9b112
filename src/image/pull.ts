/**
 * Base images from a registry (OCI or Docker v2), made bootable: Debian's `skopeo` fetches the
 * manifest from the first endpoint that has it (the registry's mirrors, then the registry:
 * fetch.ts) (a manifest list resolves to linux/amd64), every blob (token and basic auth, gzip and
 * zstd layers, each blob's digest checked while it streams) into a `dir:` copy with
 * decompressed layers; that copy is written as an OCI layout which Debian's `umoci` unpacks
 * (layers applied in order, whiteouts and opaque directories honoured, digests checked again).
 * The `user` account and a shell where the image has none go into the tree, every path resolved
 * inside it (init and envd come from the tools drive every VM boots through, src/tools),
 * `mkfs.ext4 -d` makes a
 * filesystem of it and it is imported as ONE committed overlaybd layer.
 *
 * Why one flattened layer and not one per image layer: the guest mounts one ext4 block device,
 * so an image layer (a tar of file changes) would have to be applied to an ext4 image at block
 * level to become an overlaybd layer (what overlaybd-apply / turboOCI do); umoci does the file
 * level work instead and one mkfs gives a compact, fsck-clean filesystem. E2B flattens too.
 * Build steps above it are per-step layers.
 *
 * Cache: `$home/images/<key>.layer` + `<key>.json`, key = sha256(manifest digest, GUEST_BITS_KEY);
 * a second pull of the same tag asks the registry for the manifest only.
 */
import { createHash, randomBytes } from "node:crypto";
import { existsSync, linkSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, truncateSync, utimesSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { importSparse } from "../storage/overlaybd/index.ts";
import { TOOLS_MOUNT } from "../tools/index.ts";
import { ImageError } from "./errors.ts";
import { CACHE_ENTRY, CACHE_ENTRY_LAYER, DIR_MANIFEST, IMAGE_CONFIG, registryDocument, type CacheEntry } from "./manifests.ts";
import { fetchImage } from "./fetch.ts";
import { formatImageRef, parseImageRef } from "./reference.ts";
import { RootTree } from "./rootfs.ts";
import type { RegistrySettings } from "./settings.ts";
import { tool } from "./skopeo.ts";
import { writeFileDurable } from "../util/durable.ts";
import { errorCode } from "../util/error.ts";

/** Process defaults of the image (its OCI config, as umoci's runtime spec has them). */
export interface ImageRunConfig {
  env: Record<string, string>;
  workdir: string;
  /** USER the image names (E2B runs steps as `user` regardless). */
  user: string;
  /** ENTRYPOINT + CMD. */
  cmd: string[];
}

/** Version of what `installGuestBits` adds to a tree (enters the cache key). */
export const GUEST_BITS_KEY = "guest-bits-v3-confined";

/** Inputs of `pullImage`. */
export interface PullOptions {
  homePath: string;
  ref: string;
  /** The build's credentials for the image's registry (never sent to its mirrors). */
  credentials?: { username: string; password: string };
  /** Mirrors, plain-HTTP registries, CAs, credentials file, proxy (`[image]`). */
  registries: RegistrySettings;
  /** Free space added to the unpacked size, MiB; and the smallest disk, MiB. */
  headroomMiB: number;
  minDiskMiB: number;
  /** Bound on each skopeo/umoci/mkfs run, ms. */
  toolTimeoutMs: number;
  /** Bound on each manifest request (the first contact with the registry), ms. */
  manifestTimeoutMs: number;
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
}

/** A bootable image layer. */
export interface PulledImage {
  /** Cache key: the manifest digest and GUEST_BITS_KEY (what the layer is made of). */
  key: string;
  ref: string;
  /** Digest of the manifest (or manifest list) the tag named. */
  digest: string;
  /** Absolute path of the committed overlaybd layer. */
  layerPath: string;
  diskBytes: number;
  config: ImageRunConfig;
  /** false: served from the cache, only the manifest was fetched. */
  pulled: boolean;
  /** Compressed bytes of the image's layers (what a pull downloads). */
  compressedBytes: number;
  /** ms spent fetching blobs (0 when cached). */
  fetchMs: number;
}


const sha256hex = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");

/** ENV/WORKDIR/USER/ENTRYPOINT+CMD from the image config blob of skopeo's `dir:` copy. */
function runConfig(dir: string, ref: string): ImageRunConfig {
  const manifest = registryDocument(DIR_MANIFEST, readFileSync(join(dir, "manifest.json"), "utf8"), "manifest", ref);
  const cfg = registryDocument(IMAGE_CONFIG, readFileSync(join(dir, manifest.config.digest.replace(/^sha256:/, "")), "utf8"), "image config", ref);
  const env: Record<string, string> = {};
  for (const kv of cfg.config?.Env ?? []) {
    const i = kv.indexOf("=");
    if (i > 0) env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return { env, workdir: cfg.config?.WorkingDir || "/", user: cfg.config?.User ?? "", cmd: [...(cfg.config?.Entrypoint ?? []), ...(cfg.config?.Cmd ?? [])] };
}

/** Turn skopeo's `dir:` copy into an OCI layout umoci reads (blobs hard-linked, OCI media types). */
function dirToOciLayout(dir: string, layout: string, ref: string): void {
  const manifest = registryDocument(DIR_MANIFEST, readFileSync(join(dir, "manifest.json"), "utf8"), "manifest", ref);
  mkdirSync(join(layout, "blobs", "sha256"), { recursive: true });
  const put = (digest: string) => {
    const hex = digest.replace(/^sha256:/, "");
    linkSync(join(dir, hex), join(layout, "blobs", "sha256", hex));
  };
  put(manifest.config.digest);
  for (const l of manifest.layers) put(l.digest);
  const oci = {
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: manifest.config.digest, size: manifest.config.size },
    layers: manifest.layers.map((l) => ({ mediaType: "application/vnd.oci.image.layer.v1.tar", digest: l.digest, size: l.size })),
  };
  const body = JSON.stringify(oci);
  const hex = sha256hex(body);
  writeFileSync(join(layout, "blobs", "sha256", hex), body);
  writeFileSync(join(layout, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  writeFileSync(
    join(layout, "index.json"),
    JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: oci.mediaType, digest: `sha256:${hex}`, size: Buffer.byteLength(body), annotations: { "org.opencontainers.image.ref.name": "img" } }] }),
  );
}

/**
 * Add what the tools drive (src/tools, mounted at /.aenv) cannot bring to an unpacked root tree:
 * the `user` account (uid 1000, home /home/user, passwordless sudo where sudoers.d exists), as
 * E2B templates have; `/etc/hosts` when missing; `/bin/sh` (the drive's busybox) when the image
 * has no shell (distroless) and a `/bin/bash` running `/bin/sh` when it has no bash (the SDKs
 * start every command with bash); the `/.aenv` mount point (needed when the disk is attached
 * read-only). Init, envd, mount points, /tmp and the resolver are the guest init's job.
 * Every path is resolved inside `rootfs` (RootTree): the image's own links and special files
 * cannot make this touch a host file.
 * @throws ImageError `image.bad_rootfs` when one of those paths holds a directory, device, FIFO
 *   or link loop where a file belongs.
 */
export function installGuestBits(rootfs: string): void {
  const t = new RootTree(rootfs);
  t.mkdirs(TOOLS_MOUNT);
  if (t.kind("etc/hosts") === "none") t.writeText("etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
  // an image without a shell gets the tools drive's busybox as /bin/sh (it picks its applet by
  // the name it is called with): envd's commands and the build's steps need one
  if (t.kind("bin/sh") === "none") t.symlink("bin/sh", `${TOOLS_MOUNT}/bin/busybox`);
  // a script, not a link: busybox would look for an applet named bash
  if (t.kind("bin/bash") === "none") t.writeText("bin/bash", '#!/bin/sh\n# added by AgentENV: this image has no bash\nexec /bin/sh "$@"\n', { uid: 0, gid: 0, mode: 0o755 });
  const append = (f: string, line: string) => {
    const old = t.readText(f) ?? "";
    t.writeText(f, `${old}${old && !old.endsWith("\n") ? "\n" : ""}${line}\n`);
  };
  if (!/^user:/m.test(t.readText("etc/passwd") ?? "")) {
    append("etc/passwd", "user:x:1000:1000::/home/user:/bin/bash");
    if (!/^user:/m.test(t.readText("etc/group") ?? "")) append("etc/group", "user:x:1000:");
    if (t.kind("etc/shadow") !== "none") append("etc/shadow", "user:*:19000:0:99999:7:::");
    if (t.kind("etc/sudoers.d") === "dir") t.writeText("etc/sudoers.d/user", "user ALL=(ALL:ALL) NOPASSWD: ALL\n", { uid: 0, gid: 0, mode: 0o440 });
  }
  if (t.kind("home/user") === "none") t.mkdirs("home/user", { uid: 1000, gid: 1000, mode: 0o755 });
}

/** Apparent size of a tree in bytes (`du -sb`). */
function treeBytes(dir: string): number {
  const r = Bun.spawnSync(["du", "-sb", dir], { stdout: "pipe" });
  return Number(r.stdout.toString().split(/\s/)[0] ?? 0);
}

/**
 * Pull `o.ref` (or find it cached) and return its bootable overlaybd layer. Work happens in a
 * temporary directory removed on every path; only a finished layer is renamed into the cache.
 * @throws ImageError (bad reference, not found, auth, TLS, digest mismatch, tool failures).
 */
export async function pullImage(o: PullOptions): Promise<PulledImage> {
  const r = parseImageRef(o.ref);
  const ref = formatImageRef(r);
  const progress = o.onProgress ?? (() => {});
  const cacheDir = join(o.homePath, "images");
  mkdirSync(cacheDir, { recursive: true });
  // private work dir (0700): the credentials file, skopeo's copy, umoci's bundle
  const work = join(cacheDir, `.pull-${randomBytes(6).toString("hex")}`);
  mkdirSync(work, { mode: 0o700 });
  let metaPath = "";
  try {
    const t0 = performance.now();
    let hit: ReturnType<typeof cachedImage> = null;
    let key = "";
    const fetched = await fetchImage(
      { ref: r, credentials: o.credentials, registries: o.registries, work, toolTimeoutMs: o.toolTimeoutMs, manifestTimeoutMs: o.manifestTimeoutMs, progress, ...(o.signal ? { signal: o.signal } : {}) },
      join(work, "dir"),
      (digest) => {
        key = sha256hex(`${digest}\0${GUEST_BITS_KEY}`).slice(0, 32);
        metaPath = join(cacheDir, `${key}.json`);
        hit = cachedImage(cacheDir, metaPath);
        return hit !== null;
      },
    );
    const { digest, compressedBytes } = fetched.manifest;
    if (hit) {
      const { m, layerPath } = hit as NonNullable<ReturnType<typeof cachedImage>>;
      utimesSync(metaPath, new Date(), new Date()); // last use, for the cache's trimming
      progress(`${ref} ${digest}: cached`);
      return { key, ref, digest, layerPath, diskBytes: m.diskBytes, config: m.config, pulled: false, compressedBytes: m.compressedBytes, fetchMs: 0 };
    }
    const fetchMs = performance.now() - t0;
    const config = runConfig(join(work, "dir"), ref);
    dirToOciLayout(join(work, "dir"), join(work, "oci"), ref);
    progress("unpacking layers (umoci)");
    const bundle = join(work, "bundle");
    await tool(["umoci", "unpack", "--image", `${join(work, "oci")}:img`, bundle], { timeoutMs: o.toolTimeoutMs, what: `unpacking ${ref}`, classify: (e) => new ImageError("image.unpack_failed", `umoci unpack of ${ref} failed: ${e.slice(-800)}`, { ref }), signal: o.signal });
    rmSync(join(work, "dir"), { recursive: true, force: true });
    rmSync(join(work, "oci"), { recursive: true, force: true });
    const rootfs = join(bundle, "rootfs");
    installGuestBits(rootfs);
    const used = treeBytes(rootfs);
    const mib = Math.max(o.minDiskMiB, Math.ceil((used * 1.25) / 1048576) + o.headroomMiB);
    const diskBytes = mib * 1048576;
    progress(`making ext4 of ${mib} MiB (${(used / 1048576).toFixed(1)} MiB of files)`);
    const img = join(work, "rootfs.ext4");
    writeFileSync(img, "");
    truncateSync(img, diskBytes);
    await tool(["mkfs.ext4", "-q", "-F", "-L", "aenv-root", "-E", "root_owner=0:0", "-d", rootfs, img], { timeoutMs: o.toolTimeoutMs, what: `making the file system of ${ref}`, classify: (e) => new ImageError("image.convert_failed", `mkfs.ext4 of ${ref} failed: ${e.slice(-800)}`, { ref }), signal: o.signal });
    rmSync(bundle, { recursive: true, force: true });
    progress("importing as an overlaybd layer");
    const tmpLayer = join(work, "rootfs.layer");
    await importSparse(img, tmpLayer);
    // never over an existing layer (its record was dropped, but builds and sandboxes may stack
    // on it: a new conversion is not the same bytes)
    let layerName = `${key}.layer`;
    try {
      linkSync(tmpLayer, join(cacheDir, layerName));
    } catch (e) {
      if (errorCode(e) !== "EEXIST") throw e;
      layerName = `${key}-${randomBytes(4).toString("hex")}.layer`;
      linkSync(tmpLayer, join(cacheDir, layerName));
    }
    const layerPath = join(cacheDir, layerName);
    const entry: CacheEntry = { layer: layerName, ref, digest, diskBytes, config, compressedBytes };
    writeFileDurable(metaPath, JSON.stringify(entry, null, 2));
    progress(`${ref} ${digest}: ${(compressedBytes / 1048576).toFixed(1)} MiB in ${(fetchMs / 1000).toFixed(1)} s`);
    return { key, ref, digest, layerPath, diskBytes, config, pulled: true, compressedBytes, fetchMs };
  } finally {
    rmSync(work, { recursive: true, force: true });
    if (metaPath) rmSync(`${metaPath}.tmp`, { force: true });
  }
}

/** The cache record at `metaPath` and its layer, when both are there. */
function cachedImage(cacheDir: string, metaPath: string): { m: CacheEntry; layerPath: string } | null {
  if (!existsSync(metaPath)) return null;
  try {
    const r = CACHE_ENTRY.parse(readFileSync(metaPath, "utf8"));
    if (!r.ok) return null; // another version's record, or damaged: pulled again
    const m = r.value;
    const layerPath = join(cacheDir, m.layer ?? basename(metaPath).replace(/\.json$/, ".layer"));
    return existsSync(layerPath) ? { m, layerPath } : null;
  } catch {
    return null;
  }
}

/** The layer file a cache record at `metaPath` names (for garbage collection), or null when unreadable. */
export function imageRecordLayer(metaPath: string): string | null {
  try {
    const r = CACHE_ENTRY_LAYER.parse(readFileSync(metaPath, "utf8"));
    if (!r.ok) return null;
    return join(dirname(metaPath), r.value.layer ?? basename(metaPath).replace(/\.json$/, ".layer"));
  } catch {
    return null;
  }
}

/** Remove what a crashed node's pulls left in `$home/images`: work directories (with their credentials file) and half-written cache records. */
export function reapPullLeftovers(homePath: string): void {
  const dir = join(homePath, "images");
  if (!existsSync(dir)) return;
  for (const name of readdirSync(dir)) {
    if ((name.startsWith(".pull-") && statSync(join(dir, name)).isDirectory()) || name.endsWith(".tmp")) rmSync(join(dir, name), { recursive: true, force: true });
  }
}
