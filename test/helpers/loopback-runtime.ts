/**
 * A SandboxRuntime without VMs for API, proxy and cluster tests and benchmarks. Each started
 * sandbox gets its own loopback address (127.x.y.z, every one of them local on Linux) and HTTP +
 * WebSocket servers on its guest ports there, so the node reaches guest port P at address:P as
 * it reaches a real guest in its slot. The default guest answers `GET /whoami` with the sandbox
 * id, node name and guest port, echoes request bodies at `/echo`, answers envd's `/health` with
 * 204 and echoes WebSocket frames prefixed with the sandbox id (the frame `port?` is answered with
 * `{id}:port={guest port}`); `opts.fetch` replaces it.
 *
 * Snapshots without `opts.snapshots` (`snapshots.take`, `.list`, `.delete`, and a create
 * naming a snapshot's id or name) are records in this runtime only, so a snapshot is held by the one node that took it:
 * what the cluster tests need to route by holder. A sandbox created from one is a fresh guest
 * (nothing of the source's state is carried over).
 *
 * Lifecycle calls can be held at a gate (`gate("resume")`) to observe a sandbox in a
 * transitional state, a running sandbox can be reported lost (`lose(id, reason)`: what the VM
 * runtime reports when a disk device is removed under a guest), and everything a real runtime answers that is not about running guests
 * (templates, network checks, volumes, metrics sampling) can be delegated to `opts.base` (e.g. a
 * VmRuntime whose network is never started).
 *
 * Snapshots with `opts.snapshots` (the base runtime's repository): a snapshot of a loopback
 * guest commits a real manifest into that repository, with one small disk layer and no memory
 * (nothing of the guest is captured); listing, lookup by id or name (a create from it) and
 * deletion are the base runtime's, as on a VM node.
 *
 * Moves between nodes with `opts.sharedStore` (one LoopbackSharedStore given to every node of a
 * test): a pause with a record puts it there, as a VM node's push of its pause snapshot does;
 * another node's take-over reads it and its resume takes it away; `stored` answers from the
 * pushing node's own marks, which outlive its restarts (a VM node's `remote/` markers); a kill
 * of a paused sandbox this node put there removes it, a release first lets go of the mark.
 */
import type { Server, ServerWebSocket } from "bun";
import { writeFileSync } from "node:fs";
import {
  OrchestratorError, type GuestTarget, type ReapReport, type RecoveredSandbox, type RuntimeKnownSandbox, type RuntimeMetrics, type RuntimeNetwork, type RuntimeSandbox, type RuntimeSharedPauses, type RuntimeSnapshots,
  type RuntimeStartSpec, type RuntimeStateCodec, type SandboxRuntime, type SnapshotInfo, type SnapshotRequest, type TemplateInfo,
} from "../../src/orchestrator/index.ts";
import { ENVD_PORT } from "../../src/envd/version.ts";
import { snapshotInfo } from "../../src/sandbox/index.ts";
import { MANIFEST_VERSION, newSnapshotId, SNAPSHOT_NAME_RE, type LocalRepository, type SnapshotManifest } from "../../src/snapshot/index.ts";

/** A guest's HTTP handler: `undefined` after a successful WebSocket upgrade. */
export type GuestFetch = (req: Request, ctx: { sandboxId: string; port: number; server: Server<GuestWs> }) => Response | undefined | Promise<Response | undefined>;
/** Data of a guest WebSocket. */
export interface GuestWs {
  sandboxId: string;
  /** Guest port the WebSocket was opened on (set by the default guest). */
  port?: number;
}

export interface LoopbackOptions {
  /** Node name shown by the default guest's /whoami. */
  name?: string;
  /** Guest ports served (default envd's 49983 and 8080). */
  ports?: number[];
  /** Guest HTTP handler (default: whoami/echo/health). */
  fetch?: GuestFetch;
  /** Guest WebSocket message handler (default: echo prefixed with the sandbox id). */
  wsMessage?: (ws: ServerWebSocket<GuestWs>, m: string | Buffer) => void;
  /** Template ids this runtime holds, each its own alias (default ["base"]). */
  templates?: string[];
  /** Runtime answering further templates, network checks, volumes and metrics. */
  base?: SandboxRuntime;
  /** The base runtime's snapshot repository: snapshots of guests are committed there (see above). */
  snapshots?: LocalRepository;
  /** A store the test's loopback nodes share: paused sandboxes move between them (see above). */
  sharedStore?: LoopbackSharedStore;
}

/** Paused sandboxes the loopback nodes of one test share (in memory). */
export interface LoopbackSharedStore {
  /** Sandbox id -> the record its pause carried and the node that put it. */
  paused: Map<string, { record: unknown; from: string }>;
  /** `<node>:<sandbox id>` of what each node put there (its markers). */
  marks: Set<string>;
}

type Op = "start" | "pause" | "resume" | "kill" | "snapshot";

/** A loopback guest's stored state: where it ran, or that it is paused. */
export type LoopbackState = { host: string } | { paused: true };

/** Reads a loopback guest's stored state back. */
const LOOPBACK_STATE: RuntimeStateCodec<LoopbackState> = {
  parse(sandboxId, stored) {
    const s = stored as Partial<{ host: unknown; paused: unknown }> | null;
    if (typeof s?.host === "string") return { host: s.host };
    if (s?.paused === true) return { paused: true };
    throw new OrchestratorError("orchestrator.bad_runtime_state", `sandbox ${sandboxId}: stored runtime state is no loopback state`, { sandboxId, field: "", value: null });
  },
};

/**
 * A hold on one lifecycle call: `reached` resolves (with the sandbox id) when a call arrives;
 * `open()` lets it and later ones through, `open(error)` makes the held call fail with `error`.
 */
export interface Gate {
  reached: Promise<string>;
  open(error?: Error): void;
}

const BASE_TEMPLATE: TemplateInfo = {
  templateID: "base",
  aliases: ["base"],
  cpuCount: 1,
  memoryMB: 512,
  diskSizeMB: 2048,
  envdVersion: "0.5.7",
  createdAt: Date.UTC(2026, 0, 1),
  updatedAt: Date.UTC(2026, 0, 1),
  buildID: "build1",
  buildStatus: "ready",
};

/** A fresh loopback address outside 127.0.0.0/16 (which other local services use). */
function loopbackAddress(): string {
  const b = () => Math.floor(Math.random() * 254) + 1;
  return `127.${b()}.${b()}.${b()}`;
}

export class LoopbackRuntime implements SandboxRuntime<LoopbackState> {
  readonly name = "loopback";
  readonly state = LOOPBACK_STATE;
  private readonly guests = new Map<string, { host: string; servers: Server<GuestWs>[]; lose: (reason: string) => void; lost: Promise<string> }>();
  /** Guests whose "VM" died while no node watched (`die`): the next recovery keeps their files. */
  private readonly died = new Set<string>();
  /** Sandboxes whose disk cannot be kept when their VM is lost (`salvage` throws). */
  private readonly unsalvageable = new Set<string>();
  private readonly gates = new Map<Op, { wait: Promise<Error | undefined>; reached: (id: string) => void }>();
  /** Template id each sandbox was started from (the source a snapshot of it records). */
  private readonly templateOf = new Map<string, string>();
  /** Sandboxes started (creates + resumes), for assertions. */
  starts = 0;
  /** The template (and build) each create started, in order, for assertions. */
  readonly started: TemplateInfo[] = [];
  /** Template ids this runtime holds (see LoopbackOptions.templates). */
  readonly templates: string[];
  /**
   * Calls per lifecycle operation, in order (`op:id`; a pause or resume without memory is
   * `pause:id:fs` / `resume:id:fs`; a guest flush before a kill or such a pause `quiesce:id`; a
   * snapshot `snapshot:id:user` or `snapshot:id:fork`), for assertions.
   */
  readonly calls: string[] = [];
  /** Without `opts.snapshots`: snapshots taken here (user ones listed, fork checkpoints not), by id. */
  private readonly snaps = new Map<string, SnapshotInfo & { kind: SnapshotRequest["kind"] }>();

  /** Paused sandboxes moving through `opts.sharedStore`; absent without one. */
  readonly shared?: RuntimeSharedPauses<LoopbackState>;

  constructor(private readonly opts: LoopbackOptions = {}) {
    this.templates = [...(opts.templates ?? ["base"])];
    const store = opts.sharedStore;
    if (store) {
      this.shared = {
        find: async (id) => {
          this.calls.push(`find:${id}`);
          const e = store.paused.get(id);
          return e ? { record: e.record, runtimeState: { paused: true } } : null;
        },
        stored: (id) => store.marks.has(this.mark(id)),
        release: async (id) => {
          this.calls.push(`release:${id}`);
          store.marks.delete(this.mark(id));
        },
      };
    }
  }

  private mark(id: string): string {
    return `${this.opts.name ?? "loopback"}:${id}`;
  }

  get volumes() {
    return this.opts.base?.volumes;
  }

  /** Hold the next and later `op` calls until `open()`. */
  gate(op: Op): Gate {
    let open!: (e: Error | undefined) => void;
    let reached!: (id: string) => void;
    const wait = new Promise<Error | undefined>((r) => (open = r));
    const hit = new Promise<string>((r) => (reached = r));
    this.gates.set(op, { wait, reached });
    return {
      reached: hit,
      open: (error?: Error) => {
        this.gates.delete(op);
        open(error);
      },
    };
  }

  /**
   * Report running sandbox `id` lost (its RuntimeSandbox.lost resolves with `reason`).
   * @throws Error when `id` does not run here
   */
  lose(id: string, reason: string): void {
    const g = this.guests.get(id);
    if (!g) throw new Error(`sandbox ${id} does not run here`);
    g.lose(reason);
  }

  /**
   * Sandbox `id`'s guest dies while no node watches (a VMM killed while the node is down): the
   * next `recover` reports it paused with its files (filesystem only).
   * @throws Error when `id` does not run here
   */
  die(id: string): void {
    if (!this.guests.has(id)) throw new Error(`sandbox ${id} does not run here`);
    this.stopGuest(id);
    this.died.add(id);
  }

  /** From now on a salvage of sandbox `id` (its VM lost) fails: its disk cannot be kept. */
  failSalvage(id: string): void {
    this.unsalvageable.add(id);
  }

  /** The address sandbox `id`'s guest ports are served at, while it runs. */
  hostOf(id: string): string | undefined {
    return this.guests.get(id)?.host;
  }

  /** The base runtime's template catalog, so the node's template service shares it. */
  get catalog(): unknown {
    return (this.opts.base as { catalog?: unknown } | undefined)?.catalog;
  }

  /** Its own templates by id, else the base runtime's (ids, aliases, `name:tag`). */
  async resolveTemplate(ref: string): Promise<TemplateInfo | null> {
    if (this.templates.includes(ref)) return { ...BASE_TEMPLATE, templateID: ref, aliases: [ref] };
    const snap = this.findSnapshot(ref, ["user", "fork"]);
    if (snap) return { ...BASE_TEMPLATE, templateID: snap.snapshotID, aliases: snap.names, buildID: snap.snapshotID, createdAt: snap.createdAt, updatedAt: snap.createdAt };
    return (await this.opts.base?.resolveTemplate(ref)) ?? null;
  }

  async listTemplates(): Promise<TemplateInfo[]> {
    const own = this.templates.map((id) => ({ ...BASE_TEMPLATE, templateID: id, aliases: [id] }));
    const more = ((await this.opts.base?.listTemplates()) ?? []).filter((t) => !own.some((o) => o.templateID === t.templateID));
    return [...own, ...more];
  }

  /** The base runtime's checks, at create and for updates (a loopback guest applies no egress rules). */
  readonly network: RuntimeNetwork = {
    check: (network, allowInternetAccess) => this.opts.base?.network?.check(network, allowInternetAccess),
    update: async (_id, policy) => void (await this.opts.base?.network?.check(policy, null)),
  };

  /** The base runtime's sampling (of a real guest); without a base, every sample fails. */
  readonly metrics: RuntimeMetrics = {
    sample: (target, signal) => this.opts.base?.metrics?.sample(target, signal) ?? Promise.reject(new Error("no metrics without a base runtime")),
  };

  private async pass(op: Op, id: string, suffix = ""): Promise<void> {
    this.calls.push(`${op}:${id}${suffix}`);
    const g = this.gates.get(op);
    if (!g) return;
    g.reached(id);
    const error = await g.wait;
    if (error) throw error;
  }

  private serve(id: string): RuntimeSandbox<LoopbackState> {
    const host = loopbackAddress();
    const name = this.opts.name ?? "loopback";
    const handler: GuestFetch =
      this.opts.fetch ??
      (async (req, { sandboxId, port, server }) => {
        const u = new URL(req.url);
        if (req.headers.get("upgrade")?.toLowerCase() === "websocket") return server.upgrade(req, { data: { sandboxId, port } }) ? undefined : new Response("no", { status: 400 });
        if (u.pathname.endsWith("/whoami")) return Response.json({ sandbox: sandboxId, node: name, port, path: u.pathname, query: u.search });
        if (u.pathname.endsWith("/echo")) return new Response(await req.arrayBuffer());
        if (u.pathname === "/health") return new Response(null, { status: 204 });
        return new Response("not found", { status: 404 });
      });
    const wsMessage =
      this.opts.wsMessage ??
      ((ws: ServerWebSocket<GuestWs>, m: string | Buffer) => {
        const text = typeof m === "string" ? m : new TextDecoder().decode(m);
        ws.send(text === "port?" ? `${ws.data.sandboxId}:port=${ws.data.port}` : `${ws.data.sandboxId}:${text}`);
      });
    const servers = (this.opts.ports ?? [ENVD_PORT, 8080]).map((port) => {
      const server: Server<GuestWs> = Bun.serve<GuestWs>({
        hostname: host,
        port,
        idleTimeout: 0,
        maxRequestBodySize: Number.MAX_SAFE_INTEGER, // as envd (Bun's default refuses bodies above 128 MiB)
        fetch: (req, srv) => handler(req, { sandboxId: id, port, server: srv }),
        websocket: { message: wsMessage },
      });
      return server;
    });
    let lose!: (reason: string) => void;
    const lost = new Promise<string>((r) => (lose = r));
    this.guests.set(id, { host, servers, lose, lost });
    return { endpoint: { host }, runtimeState: { host }, envdVersion: "0.5.7", lost };
  }

  private stopGuest(id: string): void {
    for (const s of this.guests.get(id)?.servers ?? []) s.stop(true);
    this.guests.delete(id);
  }

  async start(spec: RuntimeStartSpec): Promise<RuntimeSandbox<LoopbackState>> {
    await this.pass("start", spec.id);
    this.starts++;
    this.started.push(spec.template);
    this.templateOf.set(spec.id, spec.template.templateID);
    return this.serve(spec.id);
  }

  /**
   * A snapshot of one of `kinds` by id (`id` or `id:default`), else the newest carrying `ref` as a
   * name (with or without `:tag`): the rule of VmRuntime.findSnapshot, so a name two snapshots
   * carry resolves here as on a VM node.
   */
  private findSnapshot(ref: string, kinds: SnapshotRequest["kind"][]) {
    const id = ref.endsWith(":default") ? ref.slice(0, -8) : ref;
    const byId = this.snaps.get(id);
    if (byId && kinds.includes(byId.kind)) return byId;
    // records in creation order: the last match is the newest
    return [...this.snaps.values()].filter((s) => kinds.includes(s.kind) && s.names.some((n) => n === ref || n.replace(/:[^:/]*$/, "") === ref)).at(-1);
  }

  async pause(id: string, _state?: LoopbackState, _signal?: AbortSignal, opts?: { memory: boolean; record?: Record<string, unknown> | null }): Promise<LoopbackState> {
    await this.pass("pause", id, opts?.memory === false ? ":fs" : "");
    this.stopGuest(id);
    const store = this.opts.sharedStore;
    if (store && opts?.record) {
      store.paused.set(id, { record: opts.record, from: this.opts.name ?? "loopback" });
      store.marks.add(this.mark(id));
    }
    return { paused: true };
  }

  async resume(spec: RuntimeStartSpec, _state?: LoopbackState, opts?: { memory: boolean }): Promise<RuntimeSandbox<LoopbackState>> {
    await this.pass("resume", spec.id, opts?.memory === false ? ":fs" : "");
    this.starts++;
    // running again: the store keeps no pause of it (a VM node unpublishes its pause snapshot)
    this.opts.sharedStore?.paused.delete(spec.id);
    this.opts.sharedStore?.marks.delete(this.mark(spec.id));
    return this.serve(spec.id);
  }

  /** Snapshots of loopback guests (see the module's doc). */
  readonly snapshots: RuntimeSnapshots<LoopbackState> = {
    take: (id, _state, req) => this.takeSnapshot(id, req),
    list: () => this.listSnapshots(),
    delete: (ref) => this.deleteSnapshot(ref),
    salvage: async (id) => {
      this.calls.push(`salvage:${id}`);
      this.stopGuest(id);
      if (this.unsalvageable.has(id)) throw new Error(`the disk of ${id} cannot be kept`);
      return { paused: true };
    },
  };

  /**
   * Commit a manifest for sandbox `id` (source: `id`, `req.kind`, `req.name`) with one disk layer
   * holding the sandbox id; its template is the sandbox's own (`spec.template` of its start).
   * Without `opts.snapshots` the snapshot is a record in this runtime only (held by this node).
   * @throws OrchestratorError bad_request for a bad name or a sandbox with volumes (as VmRuntime)
   */
  private async takeSnapshot(id: string, req: SnapshotRequest): Promise<SnapshotInfo> {
    await this.pass("snapshot", id, `:${req.kind}`);
    if (req.name !== undefined && !SNAPSHOT_NAME_RE.test(req.name)) throw new OrchestratorError("orchestrator.bad_request", `invalid snapshot name ${JSON.stringify(req.name)}`, { name: req.name });
    if (req.volumes > 0) throw new OrchestratorError("orchestrator.bad_request", `sandbox ${id} has volumes attached`, { sandboxId: id });
    const repo = this.opts.snapshots;
    if (!repo) {
      const s = { snapshotID: newSnapshotId(), names: req.name ? [req.name] : [], sandboxID: id, templateID: this.templateOf.get(id) ?? "base", createdAt: Date.now(), kind: req.kind };
      this.snaps.set(s.snapshotID, s);
      const { kind: _kind, ...info } = s;
      return info;
    }
    const txn = repo.begin();
    try {
      const layer = txn.file("disk.layer");
      writeFileSync(layer, `loopback disk of ${id}\n`);
      const ref = txn.addLayer(layer);
      const m: SnapshotManifest = {
        version: MANIFEST_VERSION,
        id: newSnapshotId(),
        kind: req.kind,
        parent: null,
        createdAt: new Date().toISOString(),
        names: req.name ? [req.name] : [],
        source: { sandboxId: id, templateId: this.templateOf.get(id) ?? "base" },
        vm: { driver: "qemu", vcpus: BASE_TEMPLATE.cpuCount, memoryMiB: BASE_TEMPLATE.memoryMB, kernelKey: "", mac: "", bootArgs: "" },
        envd: { version: BASE_TEMPLATE.envdVersion, accessToken: null },
        disk: { virtualSize: BASE_TEMPLATE.diskSizeMB * 1048576, layers: [ref] },
        memory: null,
        vmState: null,
      };
      txn.publish(m);
      return snapshotInfo(m);
    } catch (e) {
      txn.abort();
      throw e;
    }
  }

  /** User snapshots, oldest first: the base runtime's with `opts.snapshots`, else this runtime's records. */
  private listSnapshots(): SnapshotInfo[] {
    if (this.opts.snapshots) return this.opts.base?.snapshots?.list() ?? [];
    return [...this.snaps.values()].filter((s) => s.kind === "user").map(({ kind: _kind, ...info }) => info);
  }

  /** Delete a user or fork snapshot by id or name; false when there is none such. */
  private async deleteSnapshot(ref: string): Promise<boolean> {
    if (this.opts.snapshots) return (await this.opts.base?.snapshots?.delete(ref)) ?? false;
    const s = this.findSnapshot(ref, ["user", "fork"]);
    if (!s) return false;
    this.calls.push(`deleteSnapshot:${s.snapshotID}`);
    this.snaps.delete(s.snapshotID);
    return true;
  }

  async quiesce(t: GuestTarget): Promise<void> {
    this.calls.push(`quiesce:${t.id}`);
  }

  async kill(id: string): Promise<void> {
    await this.pass("kill", id);
    this.stopGuest(id);
    this.templateOf.delete(id);
    const store = this.opts.sharedStore;
    if (store?.marks.delete(this.mark(id))) store.paused.delete(id);
  }

  /**
   * Guests this runtime (the same instance) still serves are adopted by the new orchestrator;
   * those that `die`d are paused with their files; the rest are gone. A guest's state is this
   * runtime's own (its host, or { paused: true }), not the base's, and a paused guest holds no
   * repository snapshot: the base reaps what it left.
   */
  async recover(known: RuntimeKnownSandbox<LoopbackState>[]): Promise<ReapReport<LoopbackState>> {
    const base = (await this.opts.base?.recover([])) ?? { stoppedVms: [], removed: [], recovered: new Map() };
    const recovered = new Map<string, RecoveredSandbox<LoopbackState>>();
    for (const k of known) {
      if (k.state !== "running" && k.state !== "pausing") continue;
      this.calls.push(`recover:${k.id}`);
      const g = this.guests.get(k.id);
      if (g) recovered.set(k.id, { kind: "adopted", sandbox: { endpoint: { host: g.host }, runtimeState: { host: g.host }, envdVersion: "0.5.7", lost: g.lost } });
      else if (this.died.delete(k.id)) recovered.set(k.id, { kind: "paused", runtimeState: { paused: true }, snapshotKind: "filesystem", why: "its VMM died while no node watched" });
    }
    return { stoppedVms: base.stoppedVms, removed: base.removed, recovered };
  }

  /** Leave the guests serving for the next orchestrator over this runtime (`shutdown_action = "detach"`). */
  async detach(): Promise<void> {
    this.calls.push("detach");
  }

  beginShutdown(): void {
    this.opts.base?.beginShutdown();
  }

  async close(): Promise<void> {
    for (const id of [...this.guests.keys()]) this.stopGuest(id);
    await this.opts.base?.close();
  }
}
