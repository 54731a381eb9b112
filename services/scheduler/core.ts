/**
 * The scheduler's logic, free of gRPC: placement, bindings with their freshness TTL, node
 * reports (heartbeats) with the roster as the truth for each node, node health from report
 * age, moves of sandboxes off nodes that are gone (RebindSandbox), and P2P bookkeeping. Node
 * status (proto NodeStatus): discovered + fresh report = READY; discovered, no report yet =
 * CONNECTING; report older than report_ttl (counted from this process's start at the
 * earliest), or unregistered and not reporting since = UNHEALTHY; lingering (terminating) +
 * fresh report = LINGERING. Only nodes discovery knows may report.
 *
 * Bindings of a node whose reports stopped stay (its sandboxes keep routing to it, and a
 * restarted node finds them where it left them) until gone_node_ttl after its last report; a
 * node silent for rebind_after may have its sandboxes moved (RebindSandbox) to a node that
 * resumes them from the shared snapshot store. A roster never takes a sandbox from another node
 * that holds it: the reporting node is told to drop its copy instead (HeartbeatResponse).
 */
import type { Logger } from "pino";
import { logger } from "../../src/observability/log.ts";
import { DeadlineTimer, SYSTEM_CLOCK, type Clock } from "../../src/util/deadline-timer.ts";
import {
  NodeSnapshot,
  NodeStatus,
  SandboxEventType,
  type HeartbeatRequest,
  type ObservedNode,
  type P2pEndpoint,
  type P2pPeer,
  type ReportSandboxEventRequest,
} from "../../src/cluster/index.ts";
import type { Discovery } from "./discovery/types.ts";
import { SchedulerError } from "./errors.ts";
import { NODE_ID_RE } from "./discovery/static.ts";
import { Picker, type Candidate, type StrategyName } from "./strategy.ts";
import type { RosterChange, SchedulerStore } from "./store/types.ts";
import type { NodeReport } from "./types.ts";
import type { NodeRef } from "../../src/cluster/index.ts";
import { LruMap } from "../../src/util/lru.ts";

/** Settings of SchedulerCore (from SchedulerConfig; clock and randomness injectable for tests). */
export interface SchedulerCoreOptions {
  /** Time and timers of report expiry (tests: a clock they move); default the system's, with `now`. */
  clock?: Clock;
  strategy: StrategyName;
  /** Freshness of a binding, ms. */
  bindingTtlMs: number;
  /** Age of the last report after which a node is UNHEALTHY, ms. */
  reportTtlMs: number;
  /** Age of the last report after which a node's bindings are dropped, ms. */
  goneNodeTtlMs: number;
  /** Age of the last report after which a node's sandboxes may be moved to another node (RebindSandbox), ms. */
  rebindAfterMs: number;
  /** Bound on P2P artifact records. */
  maxP2pArtifacts: number;
  /** Clock (tests); ignored when `clock` is given. */
  now?: () => number;
  random?: () => number;
}

/** Sandbox ids as the nodes make them (E2B: lowercase letters and digits). */
const SANDBOX_ID_RE = /^[a-z0-9]{1,64}$/;

/** Event types that bind (or refresh) a sandbox to the reporting node. */
const BINDING_EVENTS: ReadonlySet<SandboxEventType> = new Set([
  SandboxEventType.SANDBOX_EVENT_TYPE_CREATE,
  SandboxEventType.SANDBOX_EVENT_TYPE_PAUSE,
  SandboxEventType.SANDBOX_EVENT_TYPE_RESUME,
  SandboxEventType.SANDBOX_EVENT_TYPE_FORK,
]);

/** `s` as a node endpoint (http or https URL, no trailing slash), or null when it is not one. */
function httpEndpoint(s: string): string | null {
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    return null;
  }
  if ((u.protocol !== "http:" && u.protocol !== "https:") || !u.hostname) return null;
  return s.replace(/\/+$/, "");
}

function badRequest(message: string, details: Record<string, unknown> = {}): SchedulerError {
  return new SchedulerError("scheduler.bad_request", message, details);
}

/**
 * Every scheduler RPC's logic over a store (bindings, reports) and a discovery (the node set).
 * Holds in memory only what may be lost on restart: pending placements (least_loaded), the
 * nodes already swept, P2P artifact records. Errors are SchedulerErrors (codes in errors.ts).
 */
export class SchedulerCore {
  private readonly log: Logger = logger("scheduler");
  private readonly picker: Picker;
  private readonly now: () => number;
  /** When this process started: persisted bindings count their freshness from here at the earliest. */
  private readonly startedAt: number;
  /**
   * Times (unix ms) of placements a node's reports may not count yet: least_loaded adds them to
   * the reported load. A heartbeat forgets those made before its snapshot was taken.
   */
  private readonly placements = new Map<string, number[]>();
  /** Nodes logged as silent past report_ttl (cleared when they report again). */
  private readonly silent = new Set<string>();
  /** Nodes whose bindings were dropped past gone_node_ttl (cleared when they report again). */
  private readonly droppedStale = new Set<string>();
  /** P2P artifacts: "cluster\0backend\0key" -> node ids; past maxP2pArtifacts the least recently recorded goes. */
  private readonly artifacts: LruMap<string, Set<string>>;
  /** Runs the sweep when the first report runs out (one timer, armed at the earliest expiry). */
  private readonly expiry: DeadlineTimer;
  private expiryStarted = false;

  constructor(readonly store: SchedulerStore, readonly discovery: Discovery, private readonly o: SchedulerCoreOptions) {
    this.picker = new Picker(o.strategy, o.random);
    const clock = o.clock ?? { ...SYSTEM_CLOCK, now: o.now ?? SYSTEM_CLOCK.now };
    this.now = () => clock.now();
    this.startedAt = this.now();
    this.expiry = new DeadlineTimer(() => this.sweepAndNext(), (err) => this.log.warn({ err }, "sweep failed"), clock);
    this.artifacts = new LruMap(o.maxP2pArtifacts);
  }

  /**
   * Start watching reports run out: a sweep now, then one each time the earliest report passes
   * report_ttl or gone_node_ttl (a heartbeat arms its own expiry). With a store several replicas
   * share (Redis), reports another replica writes are seen by a sweep at least every report_ttl,
   * before any of them can run out.
   */
  startExpiry(): void {
    this.expiryStarted = true;
    this.expiry.armAt(this.now());
  }

  /** Stop the expiry timer (waits for a sweep in progress). */
  stopExpiry(): Promise<void> {
    return this.expiry.stop();
  }

  /** When the expiry timer fires next (unix ms), or null: for tests. */
  get nextSweepAt(): number | null {
    return this.expiry.armedAt;
  }

  /** Resolves when no sweep of the expiry timer is running (tests on a clock they move). */
  sweepsSettled(): Promise<void> {
    return this.expiry.idle();
  }

  /**
   * Age of a node's last report, ms, counted from this process's start at the earliest: a
   * report saved before a restart is as fresh as the restart (the node had no scheduler to
   * report to meanwhile), so downtime longer than report_ttl does not make every node stale.
   */
  private reportAgeMs(report: NodeReport): number {
    return this.now() - Math.max(report.node.lastSeenUnixMs, this.startedAt);
  }

  /** Status of a node given discovery membership and its last report. */
  statusOf(kind: "active" | "lingering" | null, report: NodeReport | null): NodeStatus {
    if (!report) return NodeStatus.NODE_STATUS_CONNECTING;
    if (report.leftAtUnixMs !== null || this.reportAgeMs(report) > this.o.reportTtlMs) return NodeStatus.NODE_STATUS_UNHEALTHY;
    return kind === "lingering" ? NodeStatus.NODE_STATUS_LINGERING : NodeStatus.NODE_STATUS_READY;
  }

  /** Every node discovery knows (active first, then lingering), sorted by id within each. */
  listNodes(): NodeRef[] {
    const d = this.discovery.nodes();
    return [...d.active, ...d.lingering];
  }

  private endpointOf(nodeId: string): string | null {
    const d = this.discovery.nodes();
    return (d.active.find((n) => n.nodeId === nodeId) ?? d.lingering.find((n) => n.nodeId === nodeId))?.endpoint ?? null;
  }

  /**
   * The discovery endpoint of a node that wants to report.
   * @throws SchedulerError bad_request (malformed id), unknown_node (discovery does not know it:
   *   its roster must not take over other nodes' bindings, and it could not be routed to).
   */
  private reportingNode(nodeId: string, what: string): string {
    if (!NODE_ID_RE.test(nodeId)) throw badRequest(`invalid node_id ${JSON.stringify(nodeId)}`, { nodeId });
    const endpoint = this.endpointOf(nodeId);
    if (endpoint === null) {
      throw new SchedulerError("scheduler.unknown_node", `${what} from node ${nodeId}, which discovery does not know (${this.discovery.mode} discovery; [node] id must equal the id discovery gives the node)`, { nodeId });
    }
    return endpoint;
  }

  /** Placements on `nodeId` a report may not reflect yet, newer than report_ttl (older ones a live node has reported since). */
  private recentPlacements(nodeId: string): number {
    const list = this.placements.get(nodeId);
    if (!list) return 0;
    const since = this.now() - this.o.reportTtlMs;
    while (list.length && list[0]! < since) list.shift();
    if (list.length === 0) this.placements.delete(nodeId);
    return list.length;
  }

  /**
   * Pick a node for a new sandbox among discovered, non-lingering nodes whose reports have not
   * stopped and that did not unregister (never-reported nodes count: a node may run without
   * reporting).
   * @throws SchedulerError scheduler.no_nodes when there is none.
   */
  async schedule(): Promise<NodeRef> {
    const reports = new Map((await this.store.listReports()).map((r) => [r.node.nodeId, r]));
    const candidates: Candidate[] = [];
    for (const n of this.discovery.nodes().active) {
      const r = reports.get(n.nodeId) ?? null;
      if (this.statusOf("active", r) === NodeStatus.NODE_STATUS_UNHEALTHY) continue;
      const s = r?.node.snapshot;
      candidates.push({
        ...n,
        load: (s ? s.sandboxCount + s.sandboxStartingCount : 0) + this.recentPlacements(n.nodeId),
        freeMemoryBytes: s ? Math.max(0, s.memoryTotalBytes - s.memoryUsedBytes) : 0,
      });
    }
    if (candidates.length === 0) {
      const known = this.listNodes().map((n) => n.nodeId);
      throw new SchedulerError("scheduler.no_nodes", known.length ? `no schedulable node: every node (${known.join(", ")}) stopped reporting, left or is draining` : "no nodes discovered", { nodes: known });
    }
    const pick = this.picker.pick(candidates);
    const list = this.placements.get(pick.nodeId) ?? [];
    list.push(this.now());
    this.placements.set(pick.nodeId, list);
    return { nodeId: pick.nodeId, endpoint: pick.endpoint };
  }

  /**
   * The node of a sandbox. A binding of a node that reports is kept fresh by its rosters and
   * lives until gone_node_ttl after the node's last report; one of a node that never reported
   * and is not refreshed within binding_ttl is dropped (both ages counted from this process's
   * start at the earliest).
   * @throws SchedulerError bad_request (malformed id), not_found (no binding, an expired one, or
   *   one naming a node that neither discovery nor the binding gives an endpoint for).
   */
  async lookup(sandboxId: string): Promise<NodeRef> {
    if (!SANDBOX_ID_RE.test(sandboxId)) throw badRequest(`invalid sandbox_id ${JSON.stringify(sandboxId)}: expected 1-64 lowercase letters and digits`, { sandboxId });
    const b = await this.store.getBinding(sandboxId);
    if (!b) throw new SchedulerError("scheduler.not_found", `no node holds sandbox ${sandboxId}`, { sandboxId });
    const report = await this.store.getReport(b.nodeId);
    const [age, ttl] = report ? [this.reportAgeMs(report), this.o.goneNodeTtlMs] : [this.now() - Math.max(b.updatedAt, this.startedAt), this.o.bindingTtlMs];
    if (age > ttl) {
      await this.store.deleteBinding(sandboxId, b.nodeId);
      this.log.info({ sandboxId, nodeId: b.nodeId, ageMs: age }, "binding expired");
      const why = report ? `its node ${b.nodeId} has not reported for ${ttl} ms` : `not refreshed for ${ttl} ms`;
      throw new SchedulerError("scheduler.not_found", `the binding of sandbox ${sandboxId} expired (${why})`, { sandboxId });
    }
    const endpoint = this.endpointOf(b.nodeId) ?? b.endpoint;
    if (!endpoint) throw new SchedulerError("scheduler.not_found", `sandbox ${sandboxId} is bound to node ${b.nodeId}, which discovery no longer knows`, { sandboxId, nodeId: b.nodeId });
    return { nodeId: b.nodeId, endpoint };
  }

  /**
   * Bind (or refresh) a sandbox to a node. A node discovery does not know must come with its
   * endpoint, an http(s) URL.
   * @throws SchedulerError bad_request
   */
  async recordAssignment(sandboxId: string, node: NodeRef | undefined): Promise<void> {
    if (!SANDBOX_ID_RE.test(sandboxId)) throw badRequest(`invalid sandbox_id ${JSON.stringify(sandboxId)}: expected 1-64 lowercase letters and digits`, { sandboxId });
    if (!node || !NODE_ID_RE.test(node.nodeId)) throw badRequest(`invalid node ${JSON.stringify(node?.nodeId ?? null)} for sandbox ${sandboxId}`, { sandboxId });
    let endpoint = this.endpointOf(node.nodeId);
    if (endpoint === null) {
      if (!node.endpoint) throw badRequest(`node ${node.nodeId} is unknown to discovery and the request names no endpoint`, { nodeId: node.nodeId });
      endpoint = httpEndpoint(node.endpoint);
      if (endpoint === null) throw badRequest(`node ${node.nodeId}: endpoint ${JSON.stringify(node.endpoint)} is not an http(s) URL`, { nodeId: node.nodeId });
    }
    await this.store.putBinding({ sandboxId, nodeId: node.nodeId, endpoint, updatedAt: this.now(), held: false });
  }

  /**
   * Move sandbox `sandboxId` off node `fromNodeId`, which is gone (its last report is older than
   * rebind_after, counted from this process's start at the earliest), to a node picked as for
   * a new sandbox; the new binding is not held until that node reports the sandbox. A binding
   * that no longer names `fromNodeId` is answered as it is (another caller moved it).
   * @throws SchedulerError bad_request (malformed ids), not_found (no binding), node_alive (the
   *   node reported within rebind_after, or never reported), no_nodes (no node to move it to)
   */
  async rebind(sandboxId: string, fromNodeId: string): Promise<{ node: NodeRef; moved: boolean }> {
    if (!SANDBOX_ID_RE.test(sandboxId)) throw badRequest(`invalid sandbox_id ${JSON.stringify(sandboxId)}: expected 1-64 lowercase letters and digits`, { sandboxId });
    if (!NODE_ID_RE.test(fromNodeId)) throw badRequest(`invalid from_node_id ${JSON.stringify(fromNodeId)}`, { nodeId: fromNodeId });
    const b = await this.store.getBinding(sandboxId);
    if (!b) throw new SchedulerError("scheduler.not_found", `no node holds sandbox ${sandboxId}`, { sandboxId });
    if (b.nodeId !== fromNodeId) return { node: { nodeId: b.nodeId, endpoint: this.endpointOf(b.nodeId) ?? b.endpoint }, moved: false };
    const report = await this.store.getReport(fromNodeId);
    const age = report ? this.reportAgeMs(report) : null;
    if (age === null || age <= this.o.rebindAfterMs) {
      const why = age === null ? "it never reported" : `it reported ${age} ms ago (rebind_after is ${this.o.rebindAfterMs} ms)`;
      throw new SchedulerError("scheduler.node_alive", `sandbox ${sandboxId} stays on node ${fromNodeId}: ${why}`, { sandboxId, nodeId: fromNodeId, ageMs: age });
    }
    const to = await this.schedule();
    const after = await this.store.moveBinding(fromNodeId, { sandboxId, nodeId: to.nodeId, endpoint: to.endpoint, updatedAt: this.now(), held: false });
    if (!after) throw new SchedulerError("scheduler.not_found", `no node holds sandbox ${sandboxId}`, { sandboxId });
    const moved = after.nodeId === to.nodeId;
    if (moved) this.log.warn({ sandboxId, from: fromNodeId, to: to.nodeId, silentMs: age }, "sandbox moved off a node that is gone");
    return { node: { nodeId: after.nodeId, endpoint: this.endpointOf(after.nodeId) ?? after.endpoint }, moved };
  }

  /**
   * A node's report: store it (status derived at read time) and make its roster the truth for
   * its bindings. Bindings recorded after the roster was taken (`reported_at`) are kept; ids
   * another node holds stay there and come back in `foreign` (the node drops its copies).
   * @throws SchedulerError bad_request for a missing or malformed node id or sandbox id,
   *   unknown_node for a node discovery does not know.
   */
  async heartbeat(req: HeartbeatRequest): Promise<RosterChange> {
    const endpoint = this.reportingNode(req.nodeId, "heartbeat");
    const bad = req.sandboxIds.find((id) => !SANDBOX_ID_RE.test(id));
    if (bad !== undefined) throw badRequest(`invalid sandbox id ${JSON.stringify(bad)} in the roster of node ${req.nodeId}`, { nodeId: req.nodeId });
    const now = this.now();
    const node: ObservedNode = {
      nodeId: req.nodeId,
      endpoint,
      clusterId: req.clusterId,
      serviceInstanceId: req.serviceInstanceId,
      version: req.version,
      commit: req.commit,
      machineInfo: req.machineInfo,
      snapshot: req.snapshot,
      lastSeenUnixMs: now,
    };
    await this.store.putReport({ node, p2p: req.p2pEndpoint?.address ? req.p2pEndpoint : null, leftAtUnixMs: null });
    if (this.expiryStarted) this.expiry.armAt(now + this.o.reportTtlMs + 1);
    const back = this.silent.delete(req.nodeId);
    if (this.droppedStale.delete(req.nodeId) || back) this.log.info({ nodeId: req.nodeId }, "node reports again");
    const takenAt = Math.min(req.snapshot?.reportedAtUnixMs || now, now);
    // the snapshot counts the placements made before it was taken, not those after
    const list = this.placements.get(req.nodeId);
    if (list) {
      while (list.length && list[0]! <= takenAt) list.shift();
      if (list.length === 0) this.placements.delete(req.nodeId);
    }
    const change = await this.store.reconcileRoster(req.nodeId, endpoint, req.sandboxIds, now, takenAt);
    if (change.added || change.removed) this.log.debug({ nodeId: req.nodeId, added: change.added, removed: change.removed }, "roster reconciled");
    if (change.foreign.length) this.log.warn({ nodeId: req.nodeId, sandboxIds: change.foreign }, "the roster lists sandboxes another node holds now: the node is told to drop its copies");
    return change;
  }

  /**
   * Apply lifecycle events: create/resume/fork/pause bind or refresh (never a sandbox another
   * node holds), delete unbinds. The batch is checked whole before any is applied.
   * @throws SchedulerError bad_request (malformed id, an event type outside the contract),
   *   unknown_node.
   */
  async reportEvents(req: ReportSandboxEventRequest): Promise<void> {
    const endpoint = this.reportingNode(req.nodeId, "sandbox events");
    for (const ev of req.events) {
      if (!SANDBOX_ID_RE.test(ev.sandboxId)) throw badRequest(`invalid sandbox id ${JSON.stringify(ev.sandboxId)} in an event of node ${req.nodeId}`, { nodeId: req.nodeId });
      if (!BINDING_EVENTS.has(ev.eventType) && ev.eventType !== SandboxEventType.SANDBOX_EVENT_TYPE_DELETE) {
        throw badRequest(`unknown sandbox event type ${ev.eventType} for sandbox ${ev.sandboxId} from node ${req.nodeId}`, { nodeId: req.nodeId, eventType: ev.eventType });
      }
    }
    for (const ev of req.events) {
      if (ev.eventType === SandboxEventType.SANDBOX_EVENT_TYPE_DELETE) await this.store.deleteBinding(ev.sandboxId, req.nodeId);
      else if (!(await this.store.claimBinding({ sandboxId: ev.sandboxId, nodeId: req.nodeId, endpoint, updatedAt: this.now(), held: true }))) {
        this.log.warn({ sandboxId: ev.sandboxId, nodeId: req.nodeId, eventType: SandboxEventType[ev.eventType] }, "event of a sandbox another node holds: binding left there");
      }
    }
  }

  /** Observed nodes (reported, or discovered and not yet reporting) with derived status. */
  async listObserved(clusterId = ""): Promise<ObservedNode[]> {
    const d = this.discovery.nodes();
    const kind = new Map<string, "active" | "lingering">();
    for (const n of d.lingering) kind.set(n.nodeId, "lingering");
    for (const n of d.active) kind.set(n.nodeId, "active");
    const out = new Map<string, ObservedNode>();
    for (const r of await this.store.listReports()) out.set(r.node.nodeId, this.present(r, kind.get(r.node.nodeId) ?? null));
    for (const n of [...d.active, ...d.lingering]) if (!out.has(n.nodeId)) out.set(n.nodeId, this.present(null, kind.get(n.nodeId)!, n));
    return [...out.values()].filter((n) => !clusterId || n.clusterId === clusterId || n.clusterId === "").sort((a, b) => (a.nodeId < b.nodeId ? -1 : 1));
  }

  /** One node as listObserved shows it. @throws SchedulerError not_found */
  async getNode(nodeId: string, clusterId = ""): Promise<ObservedNode> {
    const found = (await this.listObserved(clusterId)).find((n) => n.nodeId === nodeId);
    if (!found) throw new SchedulerError("scheduler.not_found", `node ${nodeId} is neither discovered nor reporting`, { nodeId });
    return found;
  }

  private present(r: NodeReport | null, kind: "active" | "lingering" | null, ref?: NodeRef): ObservedNode {
    const base: ObservedNode = r?.node ?? { nodeId: ref!.nodeId, endpoint: "", clusterId: "", serviceInstanceId: "", version: "", commit: "", machineInfo: undefined, snapshot: undefined, lastSeenUnixMs: 0 };
    const status = this.statusOf(kind, r);
    const endpoint = this.endpointOf(base.nodeId) ?? base.endpoint;
    return { ...base, endpoint, snapshot: base.snapshot ? { ...base.snapshot, status } : NodeSnapshot.fromPartial({ status }) };
  }

  /**
   * A node leaves: mark its report as left, so it is not scheduled (and shows UNHEALTHY) until it
   * reports again, and drop its bindings unless `keepBindings` (its sandboxes outlive the
   * process: paused, or left running for its next start; they then go as a silent node's do).
   * An unregister from an older process (service_instance_id differs from the current
   * report's) is ignored.
   * @returns whether the node was marked.
   */
  async unregister(nodeId: string, serviceInstanceId: string, keepBindings = false): Promise<boolean> {
    if (!NODE_ID_RE.test(nodeId)) throw badRequest(`invalid node_id ${JSON.stringify(nodeId)}`, { nodeId });
    const r = await this.store.getReport(nodeId);
    if (r && serviceInstanceId && r.node.serviceInstanceId && r.node.serviceInstanceId !== serviceInstanceId) {
      this.log.info({ nodeId, serviceInstanceId, current: r.node.serviceInstanceId }, "unregister from an older instance ignored");
      return false;
    }
    const now = this.now();
    const node: ObservedNode = r?.node ?? { nodeId, endpoint: this.endpointOf(nodeId) ?? "", clusterId: "", serviceInstanceId, version: "", commit: "", machineInfo: undefined, snapshot: undefined, lastSeenUnixMs: now };
    await this.store.putReport({ node, p2p: r?.p2p ?? null, leftAtUnixMs: now });
    const dropped = keepBindings ? 0 : await this.store.dropNodeBindings(nodeId);
    this.placements.delete(nodeId);
    this.log.info({ nodeId, bindings: dropped, keepBindings }, "node unregistered");
    return true;
  }

  /**
   * Log nodes whose reports stopped (past report_ttl) and drop the bindings of nodes silent past
   * gone_node_ttl, each once per outage. Run by the expiry timer.
   * @returns the node ids whose bindings were dropped this time.
   */
  async sweep(): Promise<string[]> {
    return (await this.sweepReports()).handled;
  }

  /** The sweep, and when it is due next (unix ms; null: no report can run out). */
  private async sweepReports(): Promise<{ handled: string[]; next: number | null }> {
    const handled: string[] = [];
    let next: number | null = null;
    const due = (at: number) => (next = next === null ? at : Math.min(next, at));
    for (const r of await this.store.listReports()) {
      const id = r.node.nodeId;
      if (this.droppedStale.has(id)) continue;
      const age = this.reportAgeMs(r);
      // each step from the first ms the age exceeds its bound
      const from = Math.max(r.node.lastSeenUnixMs, this.startedAt) + 1;
      if (age <= this.o.reportTtlMs) {
        due(from + this.o.reportTtlMs);
        continue;
      }
      if (!this.silent.has(id)) {
        this.silent.add(id);
        this.log.warn({ nodeId: id, lastSeenMsAgo: this.now() - r.node.lastSeenUnixMs, keptMs: this.o.goneNodeTtlMs }, "node stopped reporting: unschedulable; its bindings are kept until gone_node_ttl");
      }
      if (age <= this.o.goneNodeTtlMs) {
        due(from + this.o.goneNodeTtlMs);
        continue;
      }
      const n = await this.store.dropNodeBindings(id);
      this.droppedStale.add(id);
      handled.push(id);
      this.log.warn({ nodeId: id, lastSeenMsAgo: this.now() - r.node.lastSeenUnixMs, bindings: n }, "node gone past gone_node_ttl: its bindings dropped");
    }
    return { handled, next };
  }

  /** The expiry timer's run: sweep, then the next time to sweep (see `startExpiry`). */
  private async sweepAndNext(): Promise<number | null> {
    const { next } = await this.sweepReports();
    if (this.store.kind !== "redis") return next;
    const shared = this.now() + this.o.reportTtlMs;
    return next === null ? shared : Math.min(next, shared);
  }

  /** Peers advertising a P2P endpoint (fresh reports only). */
  async p2pPeers(clusterId: string, backend: string, excludeNodeId: string): Promise<P2pPeer[]> {
    const out: P2pPeer[] = [];
    for (const r of await this.store.listReports()) {
      if (!r.p2p || r.node.nodeId === excludeNodeId) continue;
      if (backend && r.p2p.backend !== backend) continue;
      if (clusterId && r.node.clusterId && r.node.clusterId !== clusterId) continue;
      if (this.statusOf("active", r) === NodeStatus.NODE_STATUS_UNHEALTHY) continue;
      out.push({ nodeId: r.node.nodeId, endpoint: r.p2p as P2pEndpoint });
    }
    return out;
  }

  private artifactKey(clusterId: string, backend: string, key: string): string {
    if (!key) throw badRequest("P2P artifact key is empty");
    return `${clusterId}\0${backend}\0${key}`;
  }

  recordArtifact(clusterId: string, backend: string, key: string, nodeId: string): void {
    if (!NODE_ID_RE.test(nodeId)) throw badRequest(`invalid node_id ${JSON.stringify(nodeId)}`, { nodeId });
    const k = this.artifactKey(clusterId, backend, key);
    const set = this.artifacts.peek(k) ?? new Set<string>();
    set.add(nodeId);
    this.artifacts.set(k, set);
  }

  forgetArtifact(clusterId: string, backend: string, key: string, nodeId: string): void {
    const k = this.artifactKey(clusterId, backend, key);
    const set = this.artifacts.peek(k);
    set?.delete(nodeId);
    if (set?.size === 0) this.artifacts.delete(k);
  }

  async lookupArtifact(clusterId: string, backend: string, key: string, excludeNodeId: string): Promise<P2pPeer[]> {
    const holders = this.artifacts.peek(this.artifactKey(clusterId, backend, key));
    if (!holders) return [];
    const peers = await this.p2pPeers(clusterId, backend, excludeNodeId);
    return peers.filter((p) => holders.has(p.nodeId));
  }
}
