/**
 * The local snapshot repository, a POSIX directory (default `$home/snapshots/`):
 *   layers/<sha256 hex>     layer files (overlaybd layers, VMM state), content-addressed, mode 0444
 *   manifests/<id>.json     committed manifests (immutable)
 *   manifests/<id>.deleted  tombstone: deleted by a user but still used by a running sandbox
 *   staging/<pid>.<rand>/   commits in progress (reaped when their process is gone); each
 *                           lists in `.linked-layers` the digests it linked into `layers/`
 * Commit protocol: every layer is written and fsynced in staging, hashed, recorded in the
 * commit's `.linked-layers`, linked into `layers/` (an equal layer already there is kept, so
 * equal layers are stored once), the folder fsynced; then the manifest is written, fsynced and
 * renamed into `manifests/`. A snapshot is visible only once every file it names is durable; a
 * crash before that leaves staging files and unreferenced layers, which `gc()` removes: at once
 * the layers a dead commit recorded, after the grace period any other unnamed layer.
 */
import { appendFileSync, closeSync, existsSync, linkSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, rmSync, statSync, utimesSync, chmodSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { logger } from "../observability/log.ts";
import { SnapshotError } from "./errors.ts";
import { digestHex, DIGEST_RE, layersOf, parseManifest, SNAPSHOT_ID_RE, type LayerRef, type SnapshotManifest } from "./manifest.ts";
import { processAlive } from "../ffi/proc.ts";
import { fsyncDir, fsyncPath, renameDurable } from "../util/durable.ts";
import { errorCode, errorMessage } from "../util/error.ts";

const log = logger("snapshot");

/**
 * File of a staging folder listing, one a line, the layer digests its commit linked into (or
 * refreshed in) `layers/`: what a commit of another process, or of a killed one, holds there.
 */
const LINKED_FILE = ".linked-layers";

/** Settings of a local repository. */
export interface LocalRepositoryOptions {
  /** Check a layer's sha256 the first time this process opens it for a restore. */
  verifyDigests: boolean;
  /**
   * An unreferenced layer or staging folder younger than this is left alone by `gc()`: another
   * process (a template build) may be committing it. ms.
   */
  gcGraceMs: number;
  /**
   * Called once a snapshot became visible (after its manifest's rename), e.g. to push it to an
   * object store. Must not throw; a failure of what it starts is its own to report.
   */
  onPublish?: (m: SnapshotManifest) => void;
  /** Called when `id` is deleted (tombstoned or removed), e.g. to delete a pushed copy. Must not throw. */
  onDelete?: (id: string) => void;
}

/** What `gc()` removed. */
export interface GcReport {
  layers: string[];
  staging: string[];
  bytes: number;
}

/**
 * sha256 of a file's bytes and its size.
 * @throws SnapshotError `snapshot.corrupt_layer` when it cannot be read
 */
export function hashFile(path: string): LayerRef {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (e) {
    throw new SnapshotError("snapshot.corrupt_layer", `layer file ${path} cannot be opened: ${errorMessage(e)}`, { path });
  }
  const h = new Bun.CryptoHasher("sha256");
  const buf = new Uint8Array(1 << 20);
  let size = 0;
  try {
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, size);
      if (n <= 0) break;
      h.update(buf.subarray(0, n));
      size += n;
    }
  } finally {
    closeSync(fd);
  }
  return { digest: `sha256:${h.digest("hex")}`, size };
}

/** Digests listed in the `.linked-layers` record of staging entry `path` (none for a file or without one). */
function linkedLayers(path: string): string[] {
  let text: string;
  try {
    text = readFileSync(join(path, LINKED_FILE), "utf8");
  } catch {
    return [];
  }
  return text.split("\n").filter((d) => DIGEST_RE.test(d));
}

/** A commit in progress: files are written into `dir`, added as layers, then published. */
export class CommitTxn {
  private readonly refs: LayerRef[] = [];
  private done = false;

  /** @internal made by `LocalRepository.begin()`. */
  constructor(
    private readonly repo: LocalRepository,
    /** Staging folder of this commit (on the repository's filesystem). */
    readonly dir: string,
  ) {}

  /** Path of a new file in the staging folder. */
  file(name: string): string {
    return join(this.dir, name);
  }

  /**
   * Make the file at `path` a layer of the repository: fsync it, hash it and link it into
   * `layers/` (kept as is when an equal layer is there). The source is removed unless
   * `keepSource` (e.g. a template's own layer file, hard-linked in).
   * @returns its digest and size
   * @throws SnapshotError `snapshot.commit_failed`
   */
  addLayer(path: string, opts: { keepSource?: boolean } = {}): LayerRef {
    if (this.done) throw new SnapshotError("snapshot.commit_failed", "commit already finished", { dir: this.dir });
    try {
      fsyncPath(path);
      // a kept source (a template's layer, a tools image) is hashed once per process and version
      const ref = opts.keepSource ? this.repo.digestOf(path) : hashFile(path);
      this.repo.pin(ref.digest);
      this.refs.push(ref);
      // recorded before the link: a gc of another process that sees the layer also sees this
      // line (or the published manifest), and a crash leaves a list of exactly what to collect
      appendFileSync(join(this.dir, LINKED_FILE), `${ref.digest}\n`);
      const dst = this.repo.layerPath(ref);
      if (existsSync(dst)) {
        // keep the stored copy; a fresh mtime keeps gc() of another process off it until we publish
        const now = new Date();
        utimesSync(dst, now, now);
      } else {
        try {
          linkSync(path, dst);
        } catch (e) {
          if (errorCode(e) === "EXDEV") {
            // another filesystem: copy in, then move into place
            const tmp = this.file(`.copy-${digestHex(ref)}`);
            Bun.spawnSync(["cp", "--reflink=auto", path, tmp]);
            renameDurable(tmp, dst);
          } else if (errorCode(e) !== "EEXIST") throw e;
        }
        chmodSync(dst, 0o444);
      }
      if (!opts.keepSource && path.startsWith(this.dir)) rmSync(path, { force: true });
      return ref;
    } catch (e) {
      if (e instanceof SnapshotError) throw e;
      throw new SnapshotError("snapshot.commit_failed", `adding layer ${path} failed: ${errorMessage(e)}`, { path }, { cause: e });
    }
  }

  /**
   * Make `m` visible: every layer it names must be in the repository; the layer folder and the
   * manifest are fsynced before the manifest's rename. Ends the commit.
   * @throws SnapshotError `snapshot.commit_failed` (nothing becomes visible), `snapshot.bad_manifest`
   */
  publish(m: SnapshotManifest): void {
    if (this.done) throw new SnapshotError("snapshot.commit_failed", "commit already finished", { dir: this.dir });
    parseManifest(m, m.id);
    try {
      for (const l of layersOf(m)) {
        if (!existsSync(this.repo.layerPath(l))) throw new SnapshotError("snapshot.commit_failed", `snapshot ${m.id} names layer ${l.digest}, which the repository does not hold`, { id: m.id, digest: l.digest });
      }
      fsyncDir(join(this.repo.root, "layers"));
      const tmp = this.file("manifest.json");
      writeFileSync(tmp, JSON.stringify(m, null, 2) + "\n");
      const dst = join(this.repo.root, "manifests", `${m.id}.json`);
      if (existsSync(dst)) throw new SnapshotError("snapshot.commit_failed", `snapshot ${m.id} already exists`, { id: m.id });
      renameDurable(tmp, dst);
    } catch (e) {
      this.abort();
      if (e instanceof SnapshotError) throw e;
      throw new SnapshotError("snapshot.commit_failed", `publishing snapshot ${m.id} failed: ${errorMessage(e)}`, { id: m.id }, { cause: e });
    }
    this.finish();
    log.info({ id: m.id, kind: m.kind, layers: layersOf(m).length }, "snapshot committed");
    this.repo.published(m);
  }

  /** Give up: remove the staging folder; layers already linked in become garbage for gc(). Idempotent. */
  abort(): void {
    if (this.done) return;
    this.finish();
  }

  private finish(): void {
    this.done = true;
    for (const r of this.refs) this.repo.unpin(r.digest);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A snapshot repository on a local filesystem. */
export class LocalRepository {
  private readonly pins = new Map<string, number>();
  private readonly verified = new Map<string, string>();
  private readonly hashes = new Map<string, LayerRef & { key: string }>();
  private readonly cache = new Map<string, { mtimeMs: number; m: SnapshotManifest }>();

  /** Create the folders under `root` when missing. */
  constructor(
    readonly root: string,
    private readonly opts: LocalRepositoryOptions,
  ) {
    for (const d of ["layers", "manifests", "staging"]) mkdirSync(join(root, d), { recursive: true });
  }

  /** Path of a layer file (which may not exist). */
  layerPath(ref: LayerRef | string): string {
    const d = typeof ref === "string" ? ref : ref.digest;
    if (!DIGEST_RE.test(d)) throw new SnapshotError("snapshot.bad_request", `bad layer digest ${JSON.stringify(d)}`, { digest: d });
    return join(this.root, "layers", digestHex(d));
  }

  /** Whether the layer is stored here. */
  hasLayer(ref: LayerRef): boolean {
    return existsSync(this.layerPath(ref));
  }

  /** Start a commit in a fresh staging folder. */
  begin(): CommitTxn {
    const dir = join(this.root, "staging", `${process.pid}.${crypto.getRandomValues(new Uint32Array(1))[0]!.toString(36)}`);
    mkdirSync(dir, { recursive: true });
    return new CommitTxn(this, dir);
  }

  /** Whether a commit of this process holds `digest` (it must stay even if nothing names it yet). */
  isPinned(digest: string): boolean {
    return this.pins.has(digest);
  }

  /** @internal CommitTxn.publish tells the `onPublish` listener. */
  published(m: SnapshotManifest): void {
    this.opts.onPublish?.(m);
  }

  /**
   * Make visible the manifest of a snapshot committed elsewhere (an object store) whose layers
   * this repository may not hold yet: they are fetched before a restore (`verifyLayer` fails on a
   * missing one). Written, fsynced and renamed like a commit; `onPublish` is not called.
   * @throws SnapshotError `snapshot.bad_manifest`, `snapshot.commit_failed` (one with this id exists)
   */
  adopt(m: SnapshotManifest): void {
    parseManifest(m, m.id);
    const dst = join(this.root, "manifests", `${m.id}.json`);
    if (existsSync(dst)) throw new SnapshotError("snapshot.commit_failed", `snapshot ${m.id} already exists`, { id: m.id });
    const tmp = join(this.root, "staging", `${process.pid}.adopt-${m.id}.json`);
    try {
      writeFileSync(tmp, JSON.stringify(m, null, 2) + "\n");
      renameDurable(tmp, dst);
    } catch (e) {
      rmSync(tmp, { force: true });
      throw new SnapshotError("snapshot.commit_failed", `adopting snapshot ${m.id} failed: ${errorMessage(e)}`, { id: m.id }, { cause: e });
    }
  }

  /** Record that the layer file of `ref` was just checked against its digest (a fetch hashed it while writing). */
  markVerified(ref: LayerRef): void {
    const st = statSync(this.layerPath(ref));
    this.verified.set(ref.digest, `${st.ino}:${st.size}:${st.mtimeMs}`);
  }

  /** @internal keep `digest` out of gc() while a commit of this process holds it. */
  pin(digest: string): void {
    this.pins.set(digest, (this.pins.get(digest) ?? 0) + 1);
  }

  /** @internal */
  unpin(digest: string): void {
    const n = (this.pins.get(digest) ?? 0) - 1;
    if (n < 0) throw new SnapshotError("snapshot.commit_failed", `pin count of ${digest} went negative`, { digest });
    if (n === 0) this.pins.delete(digest);
    else this.pins.set(digest, n);
  }

  /**
   * The digest of a file outside the repository (a template's layer), remembered by inode,
   * size and mtime so a large file is hashed once per process. @throws SnapshotError `snapshot.corrupt_layer`
   */
  digestOf(path: string): LayerRef {
    const known = this.knownHash(path);
    if (known) return known;
    const st = statSync(path);
    const ref = hashFile(path);
    this.hashes.set(path, { ...ref, key: `${st.ino}:${st.size}:${st.mtimeMs}` });
    return ref;
  }

  /** @internal the remembered digest of `path` if the file did not change since. */
  knownHash(path: string): LayerRef | undefined {
    const h = this.hashes.get(path);
    if (!h) return undefined;
    try {
      const st = statSync(path);
      if (h.key === `${st.ino}:${st.size}:${st.mtimeMs}`) return { digest: h.digest, size: h.size };
    } catch {
      // gone
    }
    this.hashes.delete(path);
    return undefined;
  }

  /**
   * Check that a layer is present and (with `verifyDigests`) that its bytes match its digest; a
   * layer checked once by this process is not read again unless its file changed.
   * @throws SnapshotError `snapshot.corrupt_layer` naming the digest and path
   */
  verifyLayer(ref: LayerRef): void {
    const path = this.layerPath(ref);
    let st;
    try {
      st = statSync(path);
    } catch {
      throw new SnapshotError("snapshot.corrupt_layer", `layer ${ref.digest} is missing from ${this.root}`, { digest: ref.digest, path });
    }
    if (st.size !== ref.size) throw new SnapshotError("snapshot.corrupt_layer", `layer ${ref.digest} has ${st.size} bytes, the manifest says ${ref.size}`, { digest: ref.digest, path, size: st.size });
    if (!this.opts.verifyDigests) return;
    const key = `${st.ino}:${st.size}:${st.mtimeMs}`;
    if (this.verified.get(ref.digest) === key) return;
    const got = hashFile(path);
    if (got.digest !== ref.digest) throw new SnapshotError("snapshot.corrupt_layer", `layer ${path} does not match its digest (${got.digest})`, { digest: ref.digest, path, got: got.digest });
    this.verified.set(ref.digest, key);
  }

  /** The manifest of `id` whether tombstoned or not, or undefined. @throws SnapshotError `snapshot.bad_manifest` */
  find(id: string): SnapshotManifest | undefined {
    if (!SNAPSHOT_ID_RE.test(id)) return undefined;
    const path = join(this.root, "manifests", `${id}.json`);
    let st;
    try {
      st = statSync(path);
    } catch {
      this.cache.delete(id);
      return undefined;
    }
    const c = this.cache.get(id);
    if (c && c.mtimeMs === st.mtimeMs) return c.m;
    let raw: unknown;
    try {
      raw = JSON.parse(readFileSync(path, "utf8"));
    } catch (e) {
      throw new SnapshotError("snapshot.bad_manifest", `snapshot manifest ${path}: ${errorMessage(e)}`, { id, path });
    }
    const m = parseManifest(raw, path);
    if (m.id !== id) throw new SnapshotError("snapshot.bad_manifest", `snapshot manifest ${path} names id ${m.id}`, { id, path });
    this.cache.set(id, { mtimeMs: st.mtimeMs, m });
    return m;
  }

  /** A visible (not tombstoned) manifest. @throws SnapshotError `snapshot.not_found` */
  get(id: string): SnapshotManifest {
    const m = this.find(id);
    if (!m || this.isTombstoned(id)) throw new SnapshotError("snapshot.not_found", `snapshot ${id} not found`, { id });
    return m;
  }

  /**
   * Every committed manifest (`hidden`: tombstoned ones too), oldest first. Unreadable ones are
   * logged and skipped, or thrown with `strict`.
   */
  list(opts: { hidden?: boolean; strict?: boolean } = {}): SnapshotManifest[] {
    const out: SnapshotManifest[] = [];
    for (const f of readdirSync(join(this.root, "manifests"))) {
      if (!f.endsWith(".json")) continue;
      const id = f.slice(0, -5);
      try {
        const m = this.find(id);
        if (m && (opts.hidden || !this.isTombstoned(id))) out.push(m);
      } catch (e) {
        if (opts.strict) throw e;
        log.warn({ err: e, id }, "skipping unreadable snapshot manifest");
      }
    }
    return out.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id));
  }

  /** Hide `id` from lookups while running sandboxes still use it; `remove` deletes it later. */
  tombstone(id: string): void {
    const p = join(this.root, "manifests", `${id}.deleted`);
    writeFileSync(p, "");
    fsyncDir(join(this.root, "manifests"));
    this.opts.onDelete?.(id);
  }

  /** Whether `id` was deleted by a user but is kept for running sandboxes. */
  isTombstoned(id: string): boolean {
    return existsSync(join(this.root, "manifests", `${id}.deleted`));
  }

  /** Delete the manifest of `id` (and its tombstone); its layers go at the next gc(). Idempotent. */
  remove(id: string): void {
    if (!SNAPSHOT_ID_RE.test(id)) return;
    rmSync(join(this.root, "manifests", `${id}.json`), { force: true });
    rmSync(join(this.root, "manifests", `${id}.deleted`), { force: true });
    this.cache.delete(id);
    this.opts.onDelete?.(id);
  }

  /**
   * Remove layers no manifest names and no commit in progress holds (pinned by a commit of this
   * process, or listed by a live commit's staging folder), and staging folders of processes that
   * are gone (or older than the grace period). A layer a dead commit recorded goes at once; any
   * other unnamed layer only once it is older than the grace period (it may be one a process
   * that records nothing is about to name). `extraKeep` adds digests still needed outside
   * manifests (e.g. layers a running VM serves). While any manifest is unreadable no layer is
   * removed (it might name them). `collect` names layers to treat like a dead commit's: the
   * layers of snapshots the caller just removed, when it knows that no restore of its own is
   * about to open them (the start-up reap, before anything runs).
   *
   * Order against a commit of another process (record, link, publish, remove its staging): the
   * layers are listed first, then staging, then manifests, so a listed layer of a commit still in
   * progress is seen in its record, or in its manifest once that commit is done.
   */
  gc(extraKeep: Iterable<string> = [], now = Date.now(), collect: Iterable<string> = []): GcReport {
    const keep = new Set<string>(extraKeep);
    const report: GcReport = { layers: [], staging: [], bytes: 0 };
    const ldir = join(this.root, "layers");
    /** Layer files and their mtime as first seen. */
    const candidates = new Map<string, number>();
    for (const f of readdirSync(ldir)) {
      if (!DIGEST_RE.test(`sha256:${f}`)) continue;
      try {
        candidates.set(f, statSync(join(ldir, f)).mtimeMs);
      } catch {
        // removed meanwhile
      }
    }
    const sdir = join(this.root, "staging");
    const deadStaging: string[] = [];
    /** Digests recorded by commits whose process is gone, and those the caller collects. */
    const orphaned = new Set<string>(collect);
    for (const f of readdirSync(sdir)) {
      const pid = Number(f.split(".")[0]);
      const p = join(sdir, f);
      let young = false;
      try {
        young = now - statSync(p).mtimeMs < this.opts.gcGraceMs;
      } catch {
        continue;
      }
      const live = pid === process.pid || (Number.isInteger(pid) && pid > 0 && processAlive(pid) && young);
      for (const d of linkedLayers(p)) (live ? keep : orphaned).add(d);
      if (!live) deadStaging.push(f);
    }
    let manifests: SnapshotManifest[];
    try {
      manifests = this.list({ hidden: true, strict: true });
    } catch (e) {
      log.error({ err: e }, "an unreadable snapshot manifest blocks layer garbage collection");
      return report;
    }
    for (const m of manifests) for (const l of layersOf(m)) keep.add(l.digest);
    for (const [f, seenMtime] of candidates) {
      const digest = `sha256:${f}`;
      if (keep.has(digest) || this.pins.has(digest)) continue;
      const p = join(ldir, f);
      let st;
      try {
        st = statSync(p);
      } catch {
        continue;
      }
      // touched since it was listed: a commit that started after the staging scan reuses it
      const dead = orphaned.has(digest) && st.mtimeMs === seenMtime;
      if (!dead && now - st.mtimeMs < this.opts.gcGraceMs) continue;
      rmSync(p, { force: true });
      report.layers.push(digest);
      report.bytes += st.size;
    }
    for (const f of deadStaging) {
      rmSync(join(sdir, f), { recursive: true, force: true });
      report.staging.push(f);
    }
    if (report.layers.length || report.staging.length) log.info({ layers: report.layers.length, staging: report.staging.length, bytes: report.bytes }, "snapshot repository garbage removed");
    return report;
  }
}
