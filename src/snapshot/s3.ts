/**
 * The snapshot repository in an S3-compatible object store, through Bun's built-in S3 client.
 * Layout under the configured prefix:
 *   layers/sha256/<hex>     layer files, content-addressed (equal layers stored once)
 *   manifests/<id>.json     committed manifests
 *   sandboxes/<id>.json     paused sandbox <id>'s current pause snapshot: {sandboxId, snapshotId}
 *                           (written after that snapshot's manifest, so it never names a missing one)
 * A push uploads every layer the store lacks, then the manifest: a PUT is atomic, so a manifest
 * is visible only once every layer it names is stored. A fetch streams a layer into a local file
 * while hashing it, and keeps it only when its size and sha256 match the manifest's.
 */
import { closeSync, fsyncSync, openSync, rmSync, writeSync } from "node:fs";
import { S3Client } from "bun";
import { logger } from "../observability/log.ts";
import { proxyFor, proxySettings, redactUrl } from "../util/proxy.ts";
import type { S3Settings } from "./config.ts";
import { SnapshotError } from "./errors.ts";
import { digestHex, layersOf, parseManifest, SNAPSHOT_ID_RE, type LayerRef, type SnapshotManifest } from "./manifest.ts";
import { errorMessage } from "../util/error.ts";

/** Sandbox ids as nodes make them (the object key names one). */
const SANDBOX_ID_RE = /^[a-z0-9]{1,64}$/;

const log = logger("snapshot.s3");

/** What one push did. Sizes in bytes. */
export interface PushReport {
  id: string;
  /** Layers the manifest names. */
  layers: number;
  /** Layers uploaded (the others were stored already) and their bytes. */
  uploaded: number;
  bytes: number;
}

/** Error codes of the store that mean "no such object". */
const NOT_FOUND = new Set(["NoSuchKey", "NotFound", "ENOENT"]);

function isNotFound(e: unknown): boolean {
  const x = e as { code?: string; name?: string };
  return NOT_FOUND.has(x?.code ?? "");
}

/** A snapshot repository in one bucket (and prefix) of an S3-compatible store. */
export class S3Repository {
  private readonly client: S3Client;

  /** No request is made here; a wrong endpoint or credential shows at the first call. */
  constructor(private readonly s: S3Settings) {
    this.client = new S3Client({
      bucket: s.bucket,
      region: s.region,
      ...(s.endpoint ? { endpoint: s.endpoint } : {}),
      ...(s.accessKeyId ? { accessKeyId: s.accessKeyId, secretAccessKey: s.secretAccessKey } : {}),
      virtualHostedStyle: s.virtualHostedStyle,
      retry: s.retries,
    });
    // Bun's S3 client has no proxy option: it reads HTTPS_PROXY / HTTP_PROXY / NO_PROXY from
    // process.env at each request, which the node set up at start (src/node/outbound.ts)
    const via = proxyFor(s.endpoint || `https://s3.${s.region}.amazonaws.com`, proxySettings({ proxy: "", noProxy: [] }));
    if (via) log.info({ store: this.location, proxy: redactUrl(via) }, "snapshot store reached through a proxy");
  }

  /** Where the store is, for logs and errors (no credentials). */
  get location(): string {
    return `s3://${this.s.bucket}/${this.s.prefix}${this.s.endpoint ? ` at ${this.s.endpoint}` : ""}`;
  }

  /** Object key of a layer. */
  layerKey(ref: LayerRef | string): string {
    return `${this.s.prefix}layers/sha256/${digestHex(ref)}`;
  }

  /** Object key of a manifest. */
  manifestKey(id: string): string {
    return `${this.s.prefix}manifests/${id}.json`;
  }

  /** Object key naming paused sandbox `sandboxId`'s pause snapshot. */
  pausedKey(sandboxId: string): string {
    return `${this.s.prefix}sandboxes/${sandboxId}.json`;
  }

  /**
   * Record that paused sandbox `sandboxId` resumes from pause snapshot `snapshotId` (which the
   * store must hold already).
   * @throws SnapshotError `snapshot.remote_failed`
   */
  async putPaused(sandboxId: string, snapshotId: string): Promise<void> {
    const key = this.pausedKey(sandboxId);
    try {
      await this.client.write(key, JSON.stringify({ sandboxId, snapshotId }) + "\n", { type: "application/json" });
    } catch (e) {
      throw this.failed("upload", key, e);
    }
  }

  /** The text of object `key`, or undefined when the store has no such object. @throws SnapshotError `snapshot.remote_failed` */
  private async readText(key: string): Promise<string | undefined> {
    try {
      return await this.client.file(key).text();
    } catch (e) {
      if (isNotFound(e)) return undefined;
      throw this.failed("get", key, e);
    }
  }

  /**
   * The pause snapshot paused sandbox `sandboxId` resumes from, or undefined when the store names none.
   * @throws SnapshotError `snapshot.remote_failed`; `snapshot.bad_manifest` for an object that is
   *   not one this store writes
   */
  async getPaused(sandboxId: string): Promise<string | undefined> {
    if (!SANDBOX_ID_RE.test(sandboxId)) return undefined;
    const key = this.pausedKey(sandboxId);
    const text = await this.readText(key);
    if (text === undefined) return undefined;
    let parsed: unknown = null;
    try {
      parsed = JSON.parse(text);
    } catch {
      // reported below
    }
    const v = typeof parsed === "object" ? (parsed as { sandboxId?: unknown; snapshotId?: unknown } | null) : null;
    if (!v || v.sandboxId !== sandboxId || typeof v.snapshotId !== "string" || !SNAPSHOT_ID_RE.test(v.snapshotId)) {
      throw new SnapshotError("snapshot.bad_manifest", `paused sandbox record ${key} in ${this.location} is not {sandboxId: "${sandboxId}", snapshotId}`, { where: key });
    }
    return v.snapshotId;
  }

  /**
   * Forget paused sandbox `sandboxId`'s pause snapshot when the store names `snapshotId` (a newer
   * one is left). Idempotent.
   * @throws SnapshotError `snapshot.remote_failed`, `snapshot.bad_manifest`
   */
  async deletePaused(sandboxId: string, snapshotId: string): Promise<void> {
    if ((await this.getPaused(sandboxId)) !== snapshotId) return;
    const key = this.pausedKey(sandboxId);
    try {
      await this.client.delete(key);
    } catch (e) {
      if (!isNotFound(e)) throw this.failed("delete", key, e);
    }
  }

  /**
   * Whether the store holds the layer with the manifest's size.
   * @throws SnapshotError `snapshot.remote_failed`
   */
  async hasLayer(ref: LayerRef): Promise<boolean> {
    const key = this.layerKey(ref);
    try {
      return (await this.client.stat(key)).size === ref.size;
    } catch (e) {
      if (isNotFound(e)) return false;
      throw this.failed("stat", key, e);
    }
  }

  /**
   * Upload the layer file at `path` unless the store holds it already.
   * @returns bytes uploaded (0: it was there)
   * @throws SnapshotError `snapshot.remote_failed`; `snapshot.corrupt_layer` when the local file's
   *   size is not the layer's
   */
  async pushLayer(ref: LayerRef, path: string): Promise<number> {
    if (await this.hasLayer(ref)) return 0;
    const file = Bun.file(path);
    if (file.size !== ref.size) throw new SnapshotError("snapshot.corrupt_layer", `layer ${path} has ${file.size} bytes, the manifest says ${ref.size}`, { digest: ref.digest, path });
    const key = this.layerKey(ref);
    try {
      await this.client.write(key, file, { partSize: this.s.partSizeBytes, queueSize: this.s.uploadConcurrency, type: "application/octet-stream" });
    } catch (e) {
      throw this.failed("upload", key, e);
    }
    // the store's 200 is trusted here; a fetch checks the bytes against the digest anyway
    return ref.size;
  }

  /**
   * Push a committed snapshot: its layers (read from `pathOf`) the store lacks, then its manifest.
   * @throws SnapshotError `snapshot.remote_failed`, `snapshot.corrupt_layer`
   */
  async push(m: SnapshotManifest, pathOf: (ref: LayerRef) => string): Promise<PushReport> {
    const report: PushReport = { id: m.id, layers: 0, uploaded: 0, bytes: 0 };
    for (const l of layersOf(m)) {
      report.layers++;
      const n = await this.pushLayer(l, pathOf(l));
      if (n > 0) {
        report.uploaded++;
        report.bytes += n;
      }
    }
    const key = this.manifestKey(m.id);
    try {
      await this.client.write(key, JSON.stringify(m, null, 2) + "\n", { type: "application/json" });
    } catch (e) {
      throw this.failed("upload", key, e);
    }
    log.info({ ...report, store: this.location }, "snapshot pushed");
    return report;
  }

  /**
   * The manifest of `id`, or undefined when the store has none.
   * @throws SnapshotError `snapshot.bad_manifest` (unparsable, or naming another id),
   *   `snapshot.remote_failed`
   */
  async getManifest(id: string): Promise<SnapshotManifest | undefined> {
    if (!SNAPSHOT_ID_RE.test(id)) return undefined;
    const key = this.manifestKey(id);
    const text = await this.readText(key);
    if (text === undefined) return undefined;
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch (e) {
      throw new SnapshotError("snapshot.bad_manifest", `snapshot manifest ${key} in ${this.location}: ${errorMessage(e)}`, { id, where: key });
    }
    const m = parseManifest(raw, key);
    if (m.id !== id) throw new SnapshotError("snapshot.bad_manifest", `snapshot manifest ${key} names id ${m.id}`, { id, where: key });
    return m;
  }

  /**
   * Ids of every manifest in the store (all pages of the listing), sorted.
   * @throws SnapshotError `snapshot.remote_failed`
   */
  async listIds(): Promise<string[]> {
    const prefix = `${this.s.prefix}manifests/`;
    const ids: string[] = [];
    let token: string | undefined;
    for (;;) {
      let page;
      try {
        page = await this.client.list({ prefix, maxKeys: 1000, ...(token ? { continuationToken: token } : {}) });
      } catch (e) {
        throw this.failed("list", prefix, e);
      }
      for (const o of page.contents ?? []) {
        const name = o.key.slice(prefix.length);
        if (name.endsWith(".json") && SNAPSHOT_ID_RE.test(name.slice(0, -5))) ids.push(name.slice(0, -5));
      }
      if (!page.isTruncated || !page.nextContinuationToken) break;
      token = page.nextContinuationToken;
    }
    return ids.sort();
  }

  /**
   * Delete the manifest of `id` (its layers stay: other snapshots may name them). Idempotent.
   * @throws SnapshotError `snapshot.remote_failed`
   */
  async deleteManifest(id: string): Promise<void> {
    const key = this.manifestKey(id);
    try {
      await this.client.delete(key);
    } catch (e) {
      if (!isNotFound(e)) throw this.failed("delete", key, e);
    }
  }

  /**
   * Download a layer into the new file `dst` (fsynced), checking its size and sha256 as it
   * arrives. On any failure `dst` is removed: nothing unverified is left behind.
   * @throws SnapshotError `snapshot.corrupt_layer` (missing from the store, wrong size or digest),
   *   `snapshot.remote_failed`
   */
  async fetchLayer(ref: LayerRef, dst: string): Promise<void> {
    const key = this.layerKey(ref);
    const fd = openSync(dst, "wx", 0o644);
    let ok = false;
    try {
      const h = new Bun.CryptoHasher("sha256");
      let n = 0;
      try {
        for await (const chunk of this.client.file(key).stream()) {
          n += chunk.length;
          // stop at once on an object longer than the layer: never write more than it may hold
          if (n > ref.size) break;
          h.update(chunk);
          let off = 0;
          while (off < chunk.length) off += writeSync(fd, chunk, off, chunk.length - off);
        }
      } catch (e) {
        if (isNotFound(e)) throw new SnapshotError("snapshot.corrupt_layer", `layer ${ref.digest} is missing from ${this.location}`, { digest: ref.digest, key });
        throw this.failed("get", key, e);
      }
      if (n !== ref.size) throw new SnapshotError("snapshot.corrupt_layer", `layer ${key} in ${this.location} has ${n > ref.size ? "more than " : ""}${n} bytes, the manifest says ${ref.size}`, { digest: ref.digest, key, size: n });
      const got = `sha256:${h.digest("hex")}`;
      if (got !== ref.digest) throw new SnapshotError("snapshot.corrupt_layer", `layer ${key} in ${this.location} does not match its digest (${got})`, { digest: ref.digest, key, got });
      fsyncSync(fd);
      ok = true;
    } finally {
      closeSync(fd);
      if (!ok) rmSync(dst, { force: true });
    }
  }

  private failed(op: string, key: string, e: unknown): SnapshotError {
    const x = e as { code?: string; name?: string; message?: string };
    return new SnapshotError("snapshot.remote_failed", `${op} of ${key} in ${this.location} failed: ${x?.code ?? x?.name ?? "error"}: ${x?.message ?? String(e)}`, { op, key, status: x?.code ?? null }, { cause: e });
  }
}
