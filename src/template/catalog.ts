/**
 * The versioned template catalog: every template built through the API (E2B's template model:
 * an id, names (aliases), builds, tags pointing at builds, one ready build to boot), kept as one
 * JSON file per template in `$home/catalog/templates/<templateID>.json` (build logs: build-log.ts).
 * Writes are atomic (tmp + rename). A build's tags move to it when it becomes ready, so a tag
 * always names a bootable build (a failed rebuild leaves `app:default` where it was).
 * Templates made by `template build-base` (`$home/templates/<name>/manifest.json`) are listed too,
 * as read-only templates with one ready build.
 * Naming facts (alias `^[a-z0-9-_]+$`, tag `^[a-z0-9-_.]+$`, 20-char ids, tag `default`):
 * ../shared/docs/template-build.md §4.
 */
import { randomUUID } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { writeFileDurable } from "../util/durable.ts";
import { asError } from "../util/error.ts";
import { describeProblem } from "../util/json-check.ts";
import { TemplateError } from "./errors.ts";
import { TEMPLATE_RECORD } from "./records.ts";
import { listTemplates as listManifests, readManifest, TEMPLATE_NAME, type TemplateManifest } from "./store.ts";
export type { BuildLogEntry, LogLevel } from "./build-log.ts";

/** Build states as E2B names them. */
export type BuildStatus = "waiting" | "building" | "ready" | "error";

/** Why a build ended in `error`: a message, the step that failed and the error's code. */
export interface BuildReason {
  message: string;
  step?: string;
  /** The failure's error code (`image.not_found`, `template.step_failed`, ...); our addition to E2B's reason. */
  code?: string;
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
  /**
   * Snapshot (id in the node's repository) of a sandbox of this build with its start command
   * running and ready: sandboxes are restored from it. Absent: they cold-boot from `layers`.
   */
  snapshot?: string;
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
  /** When the build was started (`POST /v2/.../builds/{id}`): queued for a slot from then on. */
  acceptedAt?: number;
  /** Tags the request named; they point at this build once it is ready. */
  tags?: string[];
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

/** A new template id: 20 characters of [a-z0-9], the first a letter (never looks like a number). */
function newTemplateId(): string {
  const abc = "abcdefghijklmnopqrstuvwxyz0123456789";
  const out: string[] = [];
  while (out.length < 20) {
    for (const x of crypto.getRandomValues(new Uint8Array(32))) {
      const n = out.length === 0 ? 26 : abc.length;
      // rejection sampling: a byte in the last partial run of n would favour the first letters
      if (x < 256 - (256 % n) && out.length < 20) out.push(abc[x % n]!);
    }
  }
  return out.join("");
}

/** The build a template's name alone boots: the `default` tag's, else the newest ready one. */
export function latestReadyBuild(t: TemplateRecord): BuildRecord | undefined {
  const tagged = t.tags[DEFAULT_TAG]?.buildID;
  const byTag = tagged === undefined ? undefined : t.builds.find((b) => b.buildID === tagged && b.status === "ready");
  return byTag ?? [...t.builds].reverse().find((b) => b.status === "ready");
}

/** The build listings show: the one the name boots, else the newest (waiting, building, error). */
export function shownBuild(t: TemplateRecord): BuildRecord | undefined {
  return latestReadyBuild(t) ?? t.builds[t.builds.length - 1];
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
    for (const f of readdirSync(join(this.dir, "templates"))) {
      if (!f.endsWith(".json")) continue;
      const p = join(this.dir, "templates", f);
      try {
        const r = TEMPLATE_RECORD.parse(readFileSync(p, "utf8"));
        if (!r.ok) throw new TemplateError("template.bad_manifest", `${p}: ${describeProblem(r.problem)}`, { path: p, field: r.problem.path });
        const t: TemplateRecord = r.value;
        this.byId.set(t.templateID, t);
      } catch (e) {
        onBadFile(p, asError(e));
      }
    }
  }

  /** Every template: catalog ones and `build-base` ones (by name), sorted by creation. */
  list(): TemplateRecord[] {
    const out = [...this.byId.values()];
    const taken = new Set(out.flatMap((t) => [t.templateID, ...t.aliases]));
    for (const m of listManifests(this.homePath)) if (!taken.has(m.name)) out.push(legacyRecord(m));
    return out.sort((a, b) => a.createdAt - b.createdAt || a.templateID.localeCompare(b.templateID));
  }

  /** A template by id or alias, or undefined (reads at most one `build-base` manifest). */
  find(idOrAlias: string): TemplateRecord | undefined {
    const direct = this.byId.get(idOrAlias) ?? this.findByAlias(idOrAlias);
    if (direct || !TEMPLATE_NAME.test(idOrAlias)) return direct;
    try {
      return legacyRecord(readManifest(this.homePath, idOrAlias));
    } catch {
      return undefined;
    }
  }

  private findByAlias(alias: string): TemplateRecord | undefined {
    for (const t of this.byId.values()) if (t.aliases.includes(alias)) return t;
    return undefined;
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
   * named, else the `default` tag's build, else the newest ready build.
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
      build = latestReadyBuild(template);
    }
    if (!build) throw new TemplateError("template.not_ready", `template '${ref}' has no ready build${tag !== undefined ? ` tagged ${tag}` : ""}`, { template: ref });
    return { template, build };
  }

  /**
   * Register a new build (`POST /v3/templates`): a known name keeps its templateID and gets a new
   * buildID; a new name gets a new template. The build starts `waiting`; its tags (the name's and
   * `tags`, else `default`) move to it when it is ready.
   * @throws TemplateError `template.bad_name` (grammar, or another template's id),
   *   `template.read_only` (a build-base template's name).
   */
  requestBuild(req: BuildRequest, now = Date.now()): { template: TemplateRecord; build: BuildRecord; tags: string[] } {
    const { alias, tag } = parseName(req.name);
    const tags = [...new Set([...(tag ? [tag] : []), ...(req.tags ?? [])])];
    for (const t of tags) if (!TAG_RE.test(t)) throw new TemplateError("template.bad_name", `invalid tag ${JSON.stringify(t)}`, { tag: t });
    if (tags.length === 0) tags.push(DEFAULT_TAG);
    let template = this.findByAlias(alias);
    if (!template && this.byId.has(alias)) throw new TemplateError("template.bad_name", `'${alias}' is the id of another template: name builds by their alias`, { name: req.name });
    template ??= this.find(alias);
    if (template?.legacy) throw new TemplateError("template.read_only", `template '${alias}' is made by 'agentenv template build-base' and cannot be rebuilt through the API`, { template: alias });
    if (!template) {
      template = { templateID: newTemplateId(), aliases: [alias], public: false, createdAt: now, updatedAt: now, builds: [], tags: {} };
      this.byId.set(template.templateID, template);
    }
    const build: BuildRecord = { buildID: randomUUID(), status: "waiting", cpuCount: req.cpuCount, memoryMB: req.memoryMB, diskSizeMB: req.diskSizeMB, createdAt: now, updatedAt: now, tags };
    template.builds.push(build);
    template.updatedAt = now;
    this.save(template);
    return { template, build, tags };
  }

  /** Record that a build was started (queued for a slot). Persists. */
  markAccepted(templateID: string, buildID: string, now = Date.now()): void {
    const { template, build } = this.build(templateID, buildID);
    build.acceptedAt = now;
    build.updatedAt = now;
    this.save(template);
  }

  /**
   * Change a build's status (and reason / boot spec); `ready` moves the build's tags to it.
   * The record changes in memory first, so a failed write (ENOSPC) still shows the new status
   * until the node restarts. @throws the file system's error when persisting fails.
   */
  setStatus(templateID: string, buildID: string, status: BuildStatus, extra: { reason?: BuildReason; boot?: BootSpec; diskSizeMB?: number } = {}, now = Date.now()): BuildRecord {
    const { template, build } = this.build(templateID, buildID);
    build.status = status;
    build.updatedAt = now;
    if (extra.reason) build.reason = extra.reason;
    if (extra.boot) build.boot = extra.boot;
    if (extra.diskSizeMB !== undefined) build.diskSizeMB = extra.diskSizeMB;
    if (status === "ready" || status === "error") build.finishedAt = now;
    if (status === "ready") for (const t of build.tags ?? [DEFAULT_TAG]) template.tags[t] = { buildID, createdAt: now };
    template.updatedAt = now;
    this.save(template);
    return build;
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

  /** Drop a template record (its layers stay for whatever stacks on them; GC removes them). @returns the record. */
  remove(idOrAlias: string): TemplateRecord {
    const template = this.get(idOrAlias);
    this.assertWritable(template);
    this.byId.delete(template.templateID);
    rmSync(join(this.dir, "templates", `${template.templateID}.json`), { force: true });
    return template;
  }

  /**
   * Builds the node stopped: `building` ones, and `waiting` ones already started (queued for a
   * slot), become `error` (a build is never resumed). Registered but never started builds stay
   * `waiting` (the SDK may still start them). @returns the builds failed, with why.
   */
  failInterrupted(now = Date.now()): { buildID: string; reason: string }[] {
    const out: { buildID: string; reason: string }[] = [];
    for (const t of this.byId.values()) {
      let hit = 0;
      for (const b of t.builds) {
        const why = b.status === "building" ? "the node restarted while this build ran" : b.status === "waiting" && b.acceptedAt !== undefined ? "the node restarted before this queued build ran" : null;
        if (!why) continue;
        Object.assign(b, { status: "error", reason: { message: why }, finishedAt: now, updatedAt: now });
        out.push({ buildID: b.buildID, reason: why });
        hit++;
      }
      if (hit) this.save(t);
    }
    return out;
  }

  private assertWritable(t: TemplateRecord): void {
    if (t.legacy) throw new TemplateError("template.read_only", `template '${t.templateID}' is made by 'agentenv template build-base' and is managed with that command`, { template: t.templateID });
  }

  private save(t: TemplateRecord): void {
    const p = join(this.dir, "templates", `${t.templateID}.json`);
    writeFileDurable(p, JSON.stringify(t, null, 2) + "\n");
  }
}

/** The build id a build-base template reports: its build key shaped as a UUID. */
function legacyBuildId(buildKey: string): string {
  const h = (buildKey + "0".repeat(32)).slice(0, 32);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

/** A `build-base` template as a read-only catalog record with one ready build. */
function legacyRecord(m: TemplateManifest): TemplateRecord {
  const at = Date.parse(m.createdAt) || 0;
  const buildID = legacyBuildId(m.buildKey);
  return {
    templateID: m.name,
    aliases: [m.name],
    public: true,
    createdAt: at,
    updatedAt: at,
    legacy: true,
    tags: { [DEFAULT_TAG]: { buildID, createdAt: at } },
    builds: [{ buildID, status: "ready", cpuCount: m.cpuCount ?? 0, memoryMB: m.memoryMB ?? 0, diskSizeMB: Math.floor(m.diskBytes / 1048576), createdAt: at, updatedAt: at, finishedAt: at }],
  };
}
