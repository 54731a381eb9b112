/**
 * What a sandbox starts from. Every sandbox runs from a *base* snapshot: a template's is its
 * committed snapshot (`template build-base` boots it once, a catalog build may name one), or for a
 * template without one a disk-only snapshot of its layers made on first use; a sandbox created
 * from a snapshot runs from that snapshot (this node's, or fetched from the object store by id).
 * Also the templates this node can boot, as the API lists them.
 */
import { join } from "node:path";
import type { Logger } from "pino";
import { ENVD_VERSION } from "../envd/version.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import type { SnapshotInfo } from "../orchestrator/runtime.ts";
import type { TemplateInfo } from "../orchestrator/types.ts";
import { SNAPSHOT_ID_RE, type LayerRef, type SnapshotManifest } from "../snapshot/index.ts";
import { importSparse } from "../storage/overlaybd/index.ts";
import { resolveTemplate, shownBuild, TemplateError, type BuildRecord, type ResolvedTemplate, type TemplateCatalog, type TemplateRecord } from "../template/index.ts";
import { errorMessage } from "../util/error.ts";
import type { KernelKeys } from "./capture.ts";
import { templateManifest } from "./capture.ts";
import type { VmRuntimeOptions } from "./options.ts";
import type { StartedFrom, VmState } from "./vm-state.ts";

const MiB = 1024 * 1024;

/** The snapshot a sandbox starts from, with what it records of its template. */
export type StartBase = { base: SnapshotManifest } & StartedFrom;

/** Snapshots and templates a sandbox can start from. */
export class BaseResolver {
  constructor(
    private readonly o: VmRuntimeOptions,
    readonly catalog: TemplateCatalog,
    private readonly kernelKeys: KernelKeys,
    private readonly log: Logger,
  ) {}

  private get repo() {
    return this.o.snapshots.repo;
  }

  /** Templates this node can boot, each with the build its name boots. */
  listTemplates(): TemplateInfo[] {
    return this.catalog.list().map((t) => this.templateInfo(t, shownBuild(t)));
  }

  /**
   * A template by id, alias or `name:tag`, with `buildID` the build that name boots; else a
   * snapshot by id or name (`name` or `name:tag`) described as a template; null when neither.
   */
  async resolveTemplate(ref: string): Promise<TemplateInfo | null> {
    try {
      const { template, build } = this.catalog.readyBuild(ref);
      return this.templateInfo(template, build);
    } catch (e) {
      if (!(e instanceof TemplateError)) throw e;
    }
    const m = this.findSnapshot(ref, ["user", "template", "fork"]) ?? (await this.remoteSnapshot(ref));
    return m ? snapshotTemplateInfo(m) : null;
  }

  private templateInfo(t: TemplateRecord, b: BuildRecord | undefined): TemplateInfo {
    return {
      templateID: t.templateID,
      aliases: t.aliases,
      cpuCount: b?.cpuCount || this.o.defaultCpuCount,
      memoryMB: b?.memoryMB || this.o.defaultMemoryMB,
      diskSizeMB: b?.diskSizeMB ?? 0,
      envdVersion: ENVD_VERSION,
      createdAt: t.createdAt,
      updatedAt: t.updatedAt,
      buildID: b?.buildID ?? "",
      buildStatus: b?.status ?? "waiting",
    };
  }

  /** A snapshot of one of `kinds` by id, or the newest visible one carrying `ref` as a name (with or without `:tag`). */
  findSnapshot(ref: string, kinds: SnapshotManifest["kind"][]): SnapshotManifest | undefined {
    const id = ref.endsWith(":default") ? ref.slice(0, -8) : ref;
    let m: SnapshotManifest | undefined;
    try {
      m = this.repo.find(id);
    } catch (e) {
      this.log.warn({ err: e, ref }, "unreadable snapshot manifest");
    }
    if (m && kinds.includes(m.kind) && !this.repo.isTombstoned(m.id)) return m;
    const named = this.repo.list().filter((x) => kinds.includes(x.kind) && x.names.some((n) => n === ref || n.replace(/:[^:/]*$/, "") === ref));
    return named.at(-1);
  }

  /**
   * The snapshot a new sandbox of template-or-snapshot `ref` starts from, with what it records
   * of its template (layer files, process defaults of catalog builds). A catalog template boots
   * build `buildID` when that is a ready build of it (what the create resolved, e.g. a tag's),
   * else the build its name boots.
   * @throws OrchestratorError `orchestrator.template_not_found` (404)
   */
  async baseFor(ref: string, buildID = ""): Promise<StartBase> {
    const t = this.catalog.find(ref);
    if (t && !t.legacy) {
      let b: BuildRecord;
      try {
        b = t.builds.find((x) => x.buildID === buildID && x.status === "ready") ?? this.catalog.readyBuild(t.templateID).build;
      } catch (e) {
        throw new OrchestratorError("orchestrator.template_not_found", errorMessage(e), { template: ref });
      }
      const boot = b.boot!;
      const tpl: ResolvedTemplate = {
        name: t.templateID,
        dir: this.o.homePath,
        rootfsPath: "",
        rootLayers: boot.layers.map((l) => join(this.o.homePath, l)),
        bootArgs: boot.bootArgs,
        diskBytes: boot.diskBytes,
        buildKey: b.buildID,
        snapshot: boot.snapshot ?? null,
        cpuCount: b.cpuCount || null,
        memoryMB: b.memoryMB || null,
      };
      const { envs, workdir, user, startCmd, readyCmd } = boot;
      return { base: await this.templateBase(tpl), rootLayers: tpl.rootLayers, boot: { envs, workdir, user, startCmd, readyCmd } };
    }
    if (t) {
      const tpl = resolveTemplate(this.o.homePath, t.templateID);
      return { base: await this.templateBase(tpl), rootLayers: tpl.rootLayers, boot: null };
    }
    const m = this.findSnapshot(ref, ["user", "template", "fork"]) ?? (await this.remoteSnapshot(ref));
    if (m) return { base: m, rootLayers: [], boot: null };
    throw new OrchestratorError("orchestrator.template_not_found", `template or snapshot '${ref}' not found`, { template: ref });
  }

  /**
   * The base snapshot a running or paused sandbox's state names.
   * @throws OrchestratorError `orchestrator.snapshot_missing`
   */
  baseOfState(id: string, st: VmState): SnapshotManifest {
    const base = this.repo.find(st.base);
    if (!base) throw new OrchestratorError("orchestrator.snapshot_missing", `base snapshot ${st.base} of sandbox ${id} is missing`, { sandboxId: id, snapshot: st.base });
    return base;
  }

  /** A template's committed snapshot, or its disk-only one (made on first use). */
  private async templateBase(tpl: ResolvedTemplate): Promise<SnapshotManifest> {
    if (tpl.snapshot) {
      const m = this.repo.find(tpl.snapshot) ?? (await this.o.snapshots.remote?.open(tpl.snapshot));
      if (m) return m;
      this.log.warn({ template: tpl.name, snapshot: tpl.snapshot }, "template snapshot missing from the repository: cold boot");
    }
    return this.diskOnlyTemplateSnapshot(tpl);
  }

  /** The disk-only snapshot of a template without a committed one (its layers, hard-linked in), made once. */
  private async diskOnlyTemplateSnapshot(tpl: ResolvedTemplate): Promise<SnapshotManifest> {
    const have = this.repo.list({ hidden: true }).find((m) => m.kind === "template" && m.memory === null && m.source.templateId === tpl.name && m.templateBuild === tpl.buildKey);
    if (have && !this.repo.isTombstoned(have.id)) return have;
    const txn = this.repo.begin();
    try {
      let layers: LayerRef[];
      if (tpl.rootLayers.length > 0) layers = tpl.rootLayers.map((p) => txn.addLayer(p, { keepSource: true }));
      else {
        const out = txn.file("rootfs.layer");
        await importSparse(tpl.rootfsPath, out);
        layers = [txn.addLayer(out)];
      }
      const vm = {
        driver: this.o.driver.name,
        vcpus: tpl.cpuCount ?? this.o.defaultCpuCount,
        memoryMiB: tpl.memoryMB ?? this.o.defaultMemoryMB,
        kernelKey: this.kernelKeys.of(this.o.kernelPath()),
        mac: "",
      };
      const m = templateManifest(tpl, vm, layers, null);
      txn.publish(m);
      return m;
    } catch (e) {
      txn.abort();
      throw e;
    }
  }

  /** A snapshot this node lacks, by id, from the object store (its manifest adopted here). */
  private async remoteSnapshot(ref: string): Promise<SnapshotManifest | undefined> {
    const remote = this.o.snapshots.remote;
    if (!remote || !SNAPSHOT_ID_RE.test(ref)) return undefined;
    const m = await remote.open(ref);
    return m && m.kind !== "pause" ? m : undefined;
  }
}

/** A snapshot as the API lists it. */
export function snapshotInfo(m: SnapshotManifest): SnapshotInfo {
  return { snapshotID: m.id, names: m.names, sandboxID: m.source.sandboxId, templateID: m.source.templateId, createdAt: Date.parse(m.createdAt) };
}

/** A snapshot seen as a template a sandbox can be created from. */
export function snapshotTemplateInfo(m: SnapshotManifest): TemplateInfo {
  const created = Date.parse(m.createdAt);
  return {
    templateID: m.id,
    aliases: m.names,
    cpuCount: m.vm.vcpus,
    memoryMB: m.vm.memoryMiB,
    diskSizeMB: Math.floor(m.disk.virtualSize / MiB),
    envdVersion: m.envd.version,
    createdAt: created,
    updatedAt: created,
    buildID: m.id,
    buildStatus: "ready",
  };
}
