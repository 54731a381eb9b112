/**
 * Template builds as the API sees them (E2B's /v3/templates, files, v2 builds, status, logs,
 * tags, aliases; ../shared/docs/template-build.md §2): plain, already-checked calls over the
 * catalog, the upload store and the builder. Builds run in the background, at most
 * `maxConcurrentBuilds` at once (later ones stay `waiting` until a slot frees).
 */
import { logger } from "../observability/log.ts";
import type { BuildLogEntry, BuildLogs, LogLevel } from "./build-log.ts";
import type { TemplateBuilder } from "./builder.ts";
import type { TemplateCatalog, TemplateRecord } from "./catalog.ts";
import { TemplateError } from "./errors.ts";
import { collectGarbage, type GcReport } from "./gc.ts";
import type { BuildFiles } from "./files.ts";
import { checkBuildSpec } from "./spec.ts";
import { errorMessage } from "../util/error.ts";

/** Tunables of the service (`[template_build]`, `[orchestrator]` limits). */
export interface TemplateServiceOptions {
  /** Lifetime of an upload URL, seconds. */
  uploadTtlSecs: number;
  /** Largest upload, bytes. */
  maxUploadBytes: number;
  /** What `e2bdev/base` (no `from*` in the SDK) means here: an image reference or a template name. */
  defaultBase: string;
  /** Build VM vCPUs (count) and memory (MiB) when the request names none. */
  defaultCpuCount: number;
  defaultMemoryMB: number;
  /** Largest vCPU count and memory (MiB) a request may name (the sandboxes' limits). */
  maxCpuCount: number;
  maxMemoryMB: number;
  /** Builds running at once (count). */
  maxConcurrentBuilds: number;
  /** Garbage collection of layers, cache and uploads (gc.ts); absent: never collected. */
  gc?: {
    /** Period of collections, ms (also one after each template delete). */
    intervalMs: number;
    cacheMaxBytes: number;
    minAgeMs: number;
    uploadMaxAgeMs: number;
    /** Layers sandboxes and snapshots stack on (absolute paths), read at each collection. */
    pinned: () => Iterable<string>;
    /** Releases a snapshot a build committed once no build names it; absent: none are released. */
    releaseSnapshot?: (id: string) => void;
  };
}

/** Body of `POST /v3/templates` (E2B TemplateBuildRequestV3; `alias` from older SDKs). */
export interface NewBuildRequest {
  name?: string;
  alias?: string;
  tags?: string[];
  cpuCount?: number;
  memoryMB?: number;
}

const LEVELS: LogLevel[] = ["debug", "info", "warn", "error"];

/** The service. One per node. */
export class TemplateService {
  private readonly log = logger("template");
  private readonly running = new Map<string, { abort: AbortController; done: Promise<void> }>();
  private readonly queue: (() => void)[] = [];
  private active = 0;
  private closed = false;

  constructor(
    readonly catalog: TemplateCatalog,
    private readonly logStore: BuildLogs,
    readonly files: BuildFiles,
    private readonly builder: TemplateBuilder,
    readonly opts: TemplateServiceOptions,
  ) {
    const cut = catalog.failInterrupted();
    // its log ends saying why (what `template build` and the SDK's status show last)
    for (const b of cut) {
      try {
        logStore.append(b.buildID, [{ timestamp: new Date().toISOString(), level: "error", message: `build failed: ${b.reason}` }]);
      } catch (err) {
        this.log.warn({ buildID: b.buildID, err }, "the interrupted build's log could not be written");
      }
    }
    if (cut.length) this.log.warn({ builds: cut.map((b) => b.buildID) }, "builds interrupted by a node restart marked error");
    builder.reapLeftovers();
    if (opts.gc) {
      this.gcTimer = setInterval(() => this.collect(), opts.gc.intervalMs);
      this.gcTimer.unref();
    }
  }

  private gcTimer?: ReturnType<typeof setInterval>;

  /**
   * Collect unreferenced layers, trim the cache and old uploads (gc.ts) when no build runs or
   * waits for a slot (a build's new layers are not yet named by any record).
   * @returns the report, or null when skipped (builds in progress, no gc configured).
   */
  collect(): GcReport | null {
    const g = this.opts.gc;
    if (!g || this.closed || this.running.size > 0) return null;
    try {
      const r = collectGarbage({ homePath: this.catalog.homePath, catalog: this.catalog, cacheMaxBytes: g.cacheMaxBytes, minAgeMs: g.minAgeMs, uploadMaxAgeMs: g.uploadMaxAgeMs, pinned: g.pinned(), releaseSnapshot: g.releaseSnapshot });
      if (r.removedLayers.length || r.removedUploads.length || r.removedCacheEntries || r.releasedSnapshots.length) {
        this.log.info({ layers: r.removedLayers.length, uploads: r.removedUploads.length, cacheEntries: r.removedCacheEntries, snapshots: r.releasedSnapshots, freedBytes: r.freedBytes, cacheBytes: r.cacheBytes }, "template files collected");
      }
      return r;
    } catch (e) {
      this.log.error({ err: e }, "template garbage collection failed");
      return null;
    }
  }

  /**
   * Register a build (`POST /v3/templates`).
   * @throws TemplateError `template.bad_name` / `template.bad_request` (400), `template.read_only`.
   */
  request(body: NewBuildRequest): { templateID: string; buildID: string; public: boolean; names: string[]; aliases: string[]; tags: string[] } {
    const name = body.name ?? body.alias;
    if (!name) throw new TemplateError("template.bad_request", "name is required", { field: "name" });
    const cpuCount = body.cpuCount ?? this.opts.defaultCpuCount;
    const memoryMB = body.memoryMB ?? this.opts.defaultMemoryMB;
    const { maxCpuCount, maxMemoryMB } = this.opts;
    if (!Number.isInteger(cpuCount) || cpuCount < 1 || cpuCount > maxCpuCount) throw new TemplateError("template.bad_request", `cpuCount must be 1..${maxCpuCount}, got ${cpuCount}`, { field: "cpuCount" });
    if (!Number.isInteger(memoryMB) || memoryMB < 128 || memoryMB > maxMemoryMB) throw new TemplateError("template.bad_request", `memoryMB must be 128..${maxMemoryMB}, got ${memoryMB}`, { field: "memoryMB" });
    const { template, build, tags } = this.catalog.requestBuild({ name, tags: body.tags, cpuCount, memoryMB, diskSizeMB: 0 });
    return { templateID: template.templateID, buildID: build.buildID, public: template.public, names: template.aliases, aliases: template.aliases, tags };
  }

  /**
   * `GET /templates/{id}/files/{hash}`: whether the archive is here, and where to PUT it.
   * @throws TemplateError `template.not_found`, `template.bad_request` (malformed hash).
   */
  fileUpload(templateID: string, hash: string, origin: string): { present: boolean; url: string } {
    const t = this.catalog.get(templateID);
    return { present: this.files.has(hash), url: this.files.uploadUrl(origin, t.templateID, hash, this.opts.uploadTtlSecs) };
  }

  /** Store an upload after checking its URL token. @throws TemplateError `template.upload_denied`, `template.upload_too_large`. */
  async acceptUpload(hash: string, q: { template: string | null; expires: string | null; token: string | null }, body: ReadableStream<Uint8Array> | null): Promise<number> {
    this.files.checkToken(q.template, hash, q.expires, q.token);
    return this.files.store(hash, body, this.opts.maxUploadBytes);
  }

  /**
   * Start a registered build (`POST /v2/templates/{id}/builds/{buildID}`).
   * @throws TemplateError `template.not_found`, `template.build_not_found`, `template.conflict`
   *   (not waiting, or already started), `template.bad_request` (body).
   */
  start(templateID: string, buildID: string, body: Record<string, unknown>): void {
    if (this.closed) throw new TemplateError("template.conflict", "the node is shutting down", { buildID });
    const { template, build } = this.catalog.build(templateID, buildID);
    if (build.status !== "waiting" || this.running.has(buildID)) {
      throw new TemplateError("template.conflict", `build ${buildID} was already started (status ${build.status})`, { templateID, buildID, status: build.status });
    }
    // a Dockerfile's FROM (`from`) is a template when this node has one of that id or alias
    const spec = checkBuildSpec(body, this.opts.defaultBase, (ref) => this.catalog.find(ref.split(":")[0]!) !== undefined);
    // persisted before it queues: a restart fails it instead of leaving it waiting forever
    this.catalog.markAccepted(template.templateID, buildID);
    const abort = new AbortController();
    const done = (async () => {
      await this.slot();
      try {
        if (!abort.signal.aborted) await this.builder.run(template.templateID, buildID, spec, abort.signal);
        else this.catalog.setStatus(template.templateID, buildID, "error", { reason: { message: "build cancelled: the node is shutting down" } });
      } finally {
        this.active--;
        this.queue.shift()?.();
        this.running.delete(buildID);
      }
    })().catch((e) => {
      // the runner could not record its outcome (a full disk): the build must not read `building` forever
      this.log.error({ err: e, buildID }, "build runner failed");
      try {
        const { build } = this.catalog.build(template.templateID, buildID);
        if (build.status === "ready" || build.status === "error") return;
        this.catalog.setStatus(template.templateID, buildID, "error", { reason: { message: `build failed: ${errorMessage(e)}`, code: (e as { code?: string }).code ?? "template.build_failed" } });
      } catch (err) {
        this.log.error({ err, buildID }, "build status could not be saved; it reads error until the node restarts");
      }
    });
    this.running.set(buildID, { abort, done });
  }

  private async slot(): Promise<void> {
    if (this.active < this.opts.maxConcurrentBuilds) {
      this.active++;
      return;
    }
    await new Promise<void>((r) => this.queue.push(r));
    this.active++;
  }

  /**
   * Build status with log entries from `logsOffset` (E2B TemplateBuildInfo).
   * @throws TemplateError `template.not_found`, `template.build_not_found`.
   */
  status(templateID: string, buildID: string, q: { logsOffset?: number; limit?: number; level?: LogLevel }) {
    const { template, build } = this.catalog.build(templateID, buildID);
    const offset = q.logsOffset ?? 0;
    const limit = q.limit ?? 100;
    // without a level filter (the SDK's polling) only the new lines are read
    const entries = q.level ? this.filter(this.logStore.all(buildID), q.level).slice(offset, offset + limit) : this.logStore.read(buildID, offset, limit);
    return {
      templateID: template.templateID,
      buildID,
      status: build.status,
      logs: entries.map((e) => `${e.timestamp} ${e.message}`),
      logEntries: entries,
      ...(build.reason ? { reason: { ...build.reason, logEntries: this.logStore.errors(buildID) } } : {}),
    };
  }

  /** Build logs by time (`GET .../logs`: cursor ms, limit, direction, level). */
  logs(templateID: string, buildID: string, q: { cursor?: number; limit?: number; direction?: "forward" | "backward"; level?: LogLevel }): { logs: BuildLogEntry[] } {
    this.catalog.build(templateID, buildID);
    let all = this.filter(this.logStore.all(buildID), q.level);
    if (q.cursor !== undefined) all = all.filter((e) => (q.direction === "backward" ? Date.parse(e.timestamp) <= q.cursor! : Date.parse(e.timestamp) >= q.cursor!));
    if (q.direction === "backward") all = all.reverse();
    return { logs: all.slice(0, q.limit ?? 100) };
  }

  private filter(entries: BuildLogEntry[], level?: LogLevel): BuildLogEntry[] {
    if (!level) return entries;
    const min = LEVELS.indexOf(level);
    return entries.filter((e) => LEVELS.indexOf(e.level) >= min);
  }

  /** A template with its builds. @throws TemplateError `template.not_found`. */
  get(idOrAlias: string): TemplateRecord {
    return this.catalog.get(idOrAlias);
  }


  /**
   * Delete a template (its record and build logs; layers stay while anything stacks on them).
   * @throws TemplateError `template.not_found`, `template.read_only`, `template.conflict` (a build runs).
   */
  remove(idOrAlias: string): void {
    const t = this.catalog.get(idOrAlias);
    if (t.builds.some((b) => this.running.has(b.buildID))) throw new TemplateError("template.conflict", `template ${t.templateID} has a build in progress`, { templateID: t.templateID });
    this.catalog.remove(t.templateID);
    for (const b of t.builds) this.logStore.remove(b.buildID);
    this.collect();
  }

  /** Stop accepting builds, cancel running ones and wait for them to end. */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.gcTimer);
    for (const r of this.running.values()) r.abort.abort(new TemplateError("template.build_failed", "the node is shutting down"));
    for (const r of this.queue.splice(0)) r();
    await Promise.allSettled([...this.running.values()].map((r) => r.done));
  }
}
