/**
 * Template builds as the API sees them (E2B's /v3/templates, files, v2 builds, status, logs,
 * tags, aliases; ../shared/docs/template-build.md §2): plain, already-checked calls over the
 * catalog, the upload store and the builder. Builds run in the background, at most
 * `maxConcurrentBuilds` at once (later ones stay `waiting` until a slot frees).
 */
import { logger } from "../observability/log.ts";
import type { TemplateBuilder } from "./builder.ts";
import { type BuildLogEntry, type BuildRecord, type LogLevel, type TemplateCatalog, type TemplateRecord } from "./catalog.ts";
import { TemplateError } from "./errors.ts";
import type { BuildFiles } from "./files.ts";
import { checkBuildSpec } from "./spec.ts";

/** Tunables of the service (`[template_build]`). */
export interface TemplateServiceOptions {
  /** Lifetime of an upload URL, seconds. */
  uploadTtlSecs: number;
  /** Largest upload, bytes. */
  maxUploadBytes: number;
  /** What `e2bdev/base` (no `from*` in the SDK) means here: an image reference or a template name. */
  defaultBase: string;
  /** Build VM size when the request names none. */
  defaultCpuCount: number;
  defaultMemoryMB: number;
  maxConcurrentBuilds: number;
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
    readonly files: BuildFiles,
    private readonly builder: TemplateBuilder,
    readonly opts: TemplateServiceOptions,
  ) {
    const n = catalog.failInterrupted();
    if (n) this.log.warn({ builds: n }, "builds interrupted by a node restart marked error");
    builder.reapLeftovers();
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
    if (!Number.isInteger(cpuCount) || cpuCount < 1 || cpuCount > 32) throw new TemplateError("template.bad_request", `cpuCount must be 1..32, got ${cpuCount}`, { field: "cpuCount" });
    if (!Number.isInteger(memoryMB) || memoryMB < 128) throw new TemplateError("template.bad_request", `memoryMB must be at least 128, got ${memoryMB}`, { field: "memoryMB" });
    const { template, build, tags } = this.catalog.requestBuild({ name, tags: body.tags, cpuCount, memoryMB, diskSizeMB: 0 });
    return { templateID: template.templateID, buildID: build.buildID, public: template.public, names: template.aliases, aliases: template.aliases, tags };
  }

  /**
   * `GET /templates/{id}/files/{hash}`: whether the archive is here, and where to PUT it.
   * @throws TemplateError `template.not_found`, `template.bad_request` (malformed hash).
   */
  fileUpload(templateID: string, hash: string, origin: string): { present: boolean; url: string } {
    this.catalog.get(templateID);
    return { present: this.files.has(hash), url: this.files.uploadUrl(origin, hash, this.opts.uploadTtlSecs) };
  }

  /** Store an upload after checking its URL token. @throws TemplateError `template.upload_denied`, `template.upload_too_large`. */
  async acceptUpload(hash: string, expires: string | null, token: string | null, body: ReadableStream<Uint8Array> | null): Promise<number> {
    this.files.checkToken(hash, expires, token);
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
    const spec = checkBuildSpec(body, this.opts.defaultBase);
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
    })().catch((e) => this.log.error({ err: e, buildID }, "build runner failed"));
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
    const all = this.filter(this.catalog.readLog(buildID), q.level);
    const entries = all.slice(q.logsOffset ?? 0, (q.logsOffset ?? 0) + (q.limit ?? 100));
    return {
      templateID: template.templateID,
      buildID,
      status: build.status,
      logs: entries.map((e) => `${e.timestamp} ${e.message}`),
      logEntries: entries,
      ...(build.reason ? { reason: { ...build.reason, logEntries: all.filter((e) => e.level === "error").slice(-20) } } : {}),
    };
  }

  /** Build logs by time (`GET .../logs`: cursor ms, limit, direction, level). */
  logs(templateID: string, buildID: string, q: { cursor?: number; limit?: number; direction?: "forward" | "backward"; level?: LogLevel }): { logs: BuildLogEntry[] } {
    this.catalog.build(templateID, buildID);
    let all = this.filter(this.catalog.readLog(buildID), q.level);
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

  /** Newest build of a template (what listings show). */
  static latest(t: TemplateRecord): BuildRecord | undefined {
    return [...t.builds].reverse().find((b) => b.status === "ready") ?? t.builds[t.builds.length - 1];
  }

  /**
   * Delete a template (its record and logs; cached layers stay for other builds).
   * @throws TemplateError `template.not_found`, `template.read_only`, `template.conflict` (a build runs).
   */
  remove(idOrAlias: string): void {
    const t = this.catalog.get(idOrAlias);
    if (t.builds.some((b) => this.running.has(b.buildID))) throw new TemplateError("template.conflict", `template ${t.templateID} has a build in progress`, { templateID: t.templateID });
    this.catalog.remove(t.templateID);
  }

  /** Stop accepting builds, cancel running ones and wait for them to end. */
  async close(): Promise<void> {
    this.closed = true;
    for (const r of this.running.values()) r.abort.abort(new TemplateError("template.build_failed", "the node is shutting down"));
    for (const r of this.queue.splice(0)) r();
    await Promise.allSettled([...this.running.values()].map((r) => r.done));
  }
}
