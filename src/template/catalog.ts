/**
 * The versioned template catalog: every template built through the API (E2B's template model:
 * an id, names (aliases), builds, tags pointing at builds, one ready build to boot), kept as one
 * JSON file per template in `$home/catalog/templates/<templateID>.json` and one JSON-lines log per
 * build in `$home/catalog/logs/<buildID>.jsonl`. Writes are atomic (tmp + rename).
 * Templates made by `template build-base` (`$home/templates/<name>/manifest.json`) are listed too,
 * as read-only templates with one ready build.
 * Naming facts (alias `^[a-z0-9-_]+$`, tag `^[a-z0-9-_.]+$`, 20-char ids, tag `default`):
 * ../shared/docs/template-build.md §4.
 */
import { randomUUID } from "node:crypto";
import { appendFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { TemplateError } from "./errors.ts";
import { listTemplates as listManifests } from "./store.ts";

/** Build states as E2B names them. */
export type BuildStatus = "waiting" | "building" | "ready" | "error";
/** Log levels of build log entries. */
export type LogLevel = "debug" | "info" | "warn" | "error";

/** One build log line. `step` is "base", "<n>" (1-based) or "finalize" as E2B numbers them. */
export interface BuildLogEntry {
  /** RFC 3339. */
  timestamp: string;
  level: LogLevel;
  message: string;
  step?: string;
}

/** Why a build ended in `error`: a message and the step that failed. */
export interface BuildReason {
  message: string;
  step?: string;
}

/** How sandboxes of a ready build boot and what runs in them. */
export interface BootSpec {
  /** overlaybd layers, lowest first, relative to the home directory. */
  layers: string[];
  /** Kernel command line (root device, init). */
  bootArgs: string;
  /** Root disk size, bytes. */
  diskBytes: number;
  /** Environment of processes (template ENV steps). */
  envs: Record<string, string>;
  /** Default working directory and user of processes. */
  workdir: string;
  user: string;
  /** Started in every new sandbox (cold boot) before it is handed out; empty: none. */
  startCmd: string;
  /** Polled until it exits 0 after the start command; empty: none. */
  readyCmd: string;
}

/** One build of a template. Times are unix ms. */
export interface BuildRecord {
  buildID: string;
  status: BuildStatus;
  reason?: BuildReason;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  createdAt: number;
  updatedAt: number;
  finishedAt?: number;
  /** Set once the build is ready. */
  boot?: BootSpec;
}

/** A template: id, names, builds (oldest first), tags → buildID. */
export interface TemplateRecord {
  templateID: string;
  aliases: string[];
  public: boolean;
  createdAt: number;
  updatedAt: number;
  builds: BuildRecord[];
  tags: Record<string, { buildID: string; createdAt: number }>;
  /** A template made by `template build-base` (read-only here). */
  legacy?: boolean;
}

/** E2B alias and tag grammar. */
export const ALIAS_RE = /^[a-z0-9][a-z0-9_-]{0,127}$/;
export const TAG_RE = /^[a-z0-9_-][a-z0-9_.-]{0,127}$/;
const ID_RE = /^[a-z0-9]{1,64}$/;
const BUILD_ID_RE = /^[0-9a-f-]{36}$/;
/** The tag a build gets when the request names none. */
export const DEFAULT_TAG = "default";

/**
 * Split `name[:tag]`. @throws TemplateError `template.bad_name` when either part breaks the
 * grammar (ALIAS_RE, TAG_RE).
 */
export function parseName(ref: string): { alias: string; tag?: string } {
  const i = ref.indexOf(":");
  const alias = i < 0 ? ref : ref.slice(0, i);
  const tag = i < 0 ? undefined : ref.slice(i + 1);
  if (!ALIAS_RE.test(alias)) throw new TemplateError("template.bad_name", `invalid template name ${JSON.stringify(alias)}: lowercase letters, digits, '-' and '_'`, { name: ref });
  if (tag !== undefined && !TAG_RE.test(tag)) throw new TemplateError("template.bad_name", `invalid tag ${JSON.stringify(tag)}: lowercase letters, digits, '-', '_' and '.'`, { name: ref });
  return { alias, tag };
}

function newTemplateId(): string {
  const abc = "abcdefghijklmnopqrstuvwxyz0123456789";
  const b = crypto.getRandomValues(new Uint8Array(20));
  // first character a letter: an id never looks like a number
  return Array.from(b, (x, i) => (i === 0 ? abc[x % 26] : abc[x % abc.length])).join("");
}

/** Options of a new build request (`POST /v3/templates`). */
export interface BuildRequest {
  /** `alias[:tag]`. */
  name: string;
  tags?: string[];
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
}

/** The catalog over one home directory. Not safe for two processes; one node owns a home. */
export class TemplateCatalog {
  readonly dir: string;
  private readonly byId = new Map<string, TemplateRecord>();

  /** Load every template file of `homePath`; unreadable files are skipped (and named by `onBadFile`). */
  constructor(readonly homePath: string, onBadFile: (path: string, err: Error) => void = () => {}) {
    this.dir = join(homePath, "catalog");
    mkdirSync(join(this.dir, "templates"), { recursive: true });
    mkdirSync(join(this.dir, "logs"), { recursive: true });
    for (const f of readdirSync(join(this.dir, "templates"))) {
      if (!f.endsWith(".json")) continue;
      const p = join(this.dir, "templates", f);
      try {
        const t = JSON.parse(readFileSync(p, "utf8")) as TemplateRecord;
        if (!ID_RE.test(t.templateID) || !Array.isArray(t.builds) || !Array.isArray(t.aliases)) throw new Error("missing fields");
        this.byId.set(t.templateID, t);
      } catch (e) {
        onBadFile(p, e as Error);
      }
    }
  }

  /** Every template: catalog ones and `build-base` ones (by name), sorted by creation. */
  list(): TemplateRecord[] {
    const out = [...this.byId.values()];
    const taken = new Set(out.flatMap((t) => [t.templateID, ...t.aliases]));
    for (const m of listManifests(this.homePath)) {
      if (taken.has(m.name)) continue;
      const at = Date.parse(m.createdAt) || 0;
      out.push({
        templateID: m.name,
        aliases: [m.name],
        public: true,
        createdAt: at,
        updatedAt: at,
        legacy: true,
        tags: { [DEFAULT_TAG]: { buildID: legacyBuildId(m.buildKey), createdAt: at } },
        builds: [{ buildID: legacyBuildId(m.buildKey), status: "ready", cpuCount: m.cpuCount ?? 0, memoryMB: m.memoryMB ?? 0, diskSizeMB: Math.floor(m.diskBytes / 1048576), createdAt: at, updatedAt: at, finishedAt: at }],
      });
    }
    return out.sort((a, b) => a.createdAt - b.createdAt || a.templateID.localeCompare(b.templateID));
  }

  /** A template by id or alias, or undefined. */
  find(idOrAlias: string): TemplateRecord | undefined {
    const direct = this.byId.get(idOrAlias);
    if (direct) return direct;
    return this.list().find((t) => t.templateID === idOrAlias || t.aliases.includes(idOrAlias));
  }

  /** A template by id or alias. @throws TemplateError `template.not_found`. */
  get(idOrAlias: string): TemplateRecord {
    const t = this.find(idOrAlias);
    if (!t) throw new TemplateError("template.not_found", `template '${idOrAlias}' not found`, { template: idOrAlias });
    return t;
  }

  /** A build of a template. @throws TemplateError `template.not_found`, `template.build_not_found`. */
  build(templateID: string, buildID: string): { template: TemplateRecord; build: BuildRecord } {
    const template = this.get(templateID);
    const build = template.builds.find((b) => b.buildID === buildID);
    if (!build) throw new TemplateError("template.build_not_found", `build ${buildID} of template ${templateID} not found`, { templateID, buildID });
    return { template, build };
  }

  /**
   * The build `ref` (`id`, `alias`, `alias:tag`, `id:tag`) boots: the tagged build when a tag is
   * named, else the newest ready build.
   * @throws TemplateError `template.not_found`, `template.not_ready` (no ready build / tag not on a ready build).
   */
  readyBuild(ref: string): { template: TemplateRecord; build: BuildRecord } {
    const i = ref.indexOf(":");
    const template = this.get(i < 0 ? ref : ref.slice(0, i));
    const tag = i < 0 ? undefined : ref.slice(i + 1);
    let build: BuildRecord | undefined;
    if (tag !== undefined) {
      const id = template.tags[tag]?.buildID;
      build = template.builds.find((b) => b.buildID === id && b.status === "ready");
    } else {
      build = [...template.builds].reverse().find((b) => b.status === "ready");
    }
    if (!build) throw new TemplateError("template.not_ready", `template '${ref}' has no ready build${tag !== undefined ? ` tagged ${tag}` : ""}`, { template: ref });
    return { template, build };
  }

  /**
   * Register a new build (`POST /v3/templates`): a known name keeps its templateID and gets a new
   * buildID; a new name gets a new template. The build starts `waiting`.
   * @throws TemplateError `template.bad_name`, `template.read_only` (a build-base template's name).
   */
  requestBuild(req: BuildRequest, now = Date.now()): { template: TemplateRecord; build: BuildRecord; tags: string[] } {
    const { alias, tag } = parseName(req.name);
    const tags = [...new Set([...(tag ? [tag] : []), ...(req.tags ?? [])])];
    for (const t of tags) if (!TAG_RE.test(t)) throw new TemplateError("template.bad_name", `invalid tag ${JSON.stringify(t)}`, { tag: t });
    if (tags.length === 0) tags.push(DEFAULT_TAG);
    let template = this.find(alias);
    if (template?.legacy) throw new TemplateError("template.read_only", `template '${alias}' is made by 'agentenv template build-base' and cannot be rebuilt through the API`, { template: alias });
    if (!template) {
      template = { templateID: newTemplateId(), aliases: [alias], public: false, createdAt: now, updatedAt: now, builds: [], tags: {} };
      this.byId.set(template.templateID, template);
    }
    const build: BuildRecord = { buildID: randomUUID(), status: "waiting", cpuCount: req.cpuCount, memoryMB: req.memoryMB, diskSizeMB: req.diskSizeMB, createdAt: now, updatedAt: now };
    template.builds.push(build);
    for (const t of tags) template.tags[t] = { buildID: build.buildID, createdAt: now };
    template.updatedAt = now;
    this.save(template);
    return { template, build, tags };
  }

  /** Change a build's status (and reason / boot spec). Persists. */
  setStatus(templateID: string, buildID: string, status: BuildStatus, extra: { reason?: BuildReason; boot?: BootSpec; diskSizeMB?: number } = {}, now = Date.now()): BuildRecord {
    const { template, build } = this.build(templateID, buildID);
    build.status = status;
    build.updatedAt = now;
    if (extra.reason) build.reason = extra.reason;
    if (extra.boot) build.boot = extra.boot;
    if (extra.diskSizeMB !== undefined) build.diskSizeMB = extra.diskSizeMB;
    if (status === "ready" || status === "error") build.finishedAt = now;
    template.updatedAt = now;
    this.save(template);
    return build;
  }

  /** Append log lines of a build (JSON lines file). */
  appendLog(buildID: string, entries: BuildLogEntry[]): void {
    if (!BUILD_ID_RE.test(buildID) || entries.length === 0) return;
    appendFileSync(this.logPath(buildID), entries.map((e) => JSON.stringify(e)).join("\n") + "\n");
  }

  /** Every log line of a build, in order ([] when none). */
  readLog(buildID: string): BuildLogEntry[] {
    const p = this.logPath(buildID);
    if (!BUILD_ID_RE.test(buildID) || !existsSync(p)) return [];
    return readFileSync(p, "utf8")
      .split("\n")
      .filter((l) => l.length > 0)
      .map((l) => JSON.parse(l) as BuildLogEntry);
  }

  /**
   * Point `tags` at the build `target` (`name:tag` or `name`, the newest ready build).
   * @throws TemplateError `template.not_found`, `template.not_ready`, `template.bad_name`.
   */
  assignTags(target: string, tags: string[], now = Date.now()): { buildID: string; tags: string[] } {
    for (const t of tags) if (!TAG_RE.test(t)) throw new TemplateError("template.bad_name", `invalid tag ${JSON.stringify(t)}`, { tag: t });
    const { template, build } = this.readyBuild(target);
    this.assertWritable(template);
    for (const t of tags) template.tags[t] = { buildID: build.buildID, createdAt: now };
    template.updatedAt = now;
    this.save(template);
    return { buildID: build.buildID, tags };
  }

  /** Remove `tags` from template `name`. @throws TemplateError `template.not_found` (template or a tag). */
  removeTags(name: string, tags: string[], now = Date.now()): void {
    const template = this.get(name);
    this.assertWritable(template);
    for (const t of tags) if (!template.tags[t]) throw new TemplateError("template.not_found", `template '${name}' has no tag ${t}`, { template: name, tag: t });
    for (const t of tags) delete template.tags[t];
    template.updatedAt = now;
    this.save(template);
  }

  /** Drop a template record and its build logs; returns the boot specs it held (for layer cleanup). */
  remove(idOrAlias: string): TemplateRecord {
    const template = this.get(idOrAlias);
    this.assertWritable(template);
    this.byId.delete(template.templateID);
    rmSync(join(this.dir, "templates", `${template.templateID}.json`), { force: true });
    for (const b of template.builds) rmSync(this.logPath(b.buildID), { force: true });
    return template;
  }

  /** Builds that were `building` when the node stopped become `error` (a build is never resumed). @returns how many. */
  failInterrupted(now = Date.now()): number {
    let n = 0;
    for (const t of this.byId.values()) {
      const hit = t.builds.filter((b) => b.status === "building");
      for (const b of hit) Object.assign(b, { status: "error", reason: { message: "the node restarted while this build ran" }, finishedAt: now, updatedAt: now });
      if (hit.length) this.save(t);
      n += hit.length;
    }
    return n;
  }

  private assertWritable(t: TemplateRecord): void {
    if (t.legacy) throw new TemplateError("template.read_only", `template '${t.templateID}' is made by 'agentenv template build-base' and is managed with that command`, { template: t.templateID });
  }

  private logPath(buildID: string): string {
    return join(this.dir, "logs", `${buildID}.jsonl`);
  }

  private save(t: TemplateRecord): void {
    const p = join(this.dir, "templates", `${t.templateID}.json`);
    writeFileSync(`${p}.tmp`, JSON.stringify(t, null, 2) + "\n");
    renameSync(`${p}.tmp`, p);
  }
}

/** The build id a build-base template reports: its build key shaped as a UUID. */
function legacyBuildId(buildKey: string): string {
  const h = (buildKey + "0".repeat(32)).slice(0, 32);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}
