/**
 * The scheduler's logic, free of gRPC: placement, bindings with their freshness TTL, node
 * reports (heartbeats) with the roster as the truth for each node, node health from report
 * age, and P2P bookkeeping. Node status (proto NodeStatus): discovered + fresh report = READY;
 * discovered, no report yet = CONNECTING; report older than report_ttl = UNHEALTHY;
 * lingering (terminating) + fresh report = LINGERING.
 */
import type { Logger } from "pino";
import { logger } from "../../src/observability/log.ts";
import {
  NodeSnapshot,
  NodeStatus,
  SandboxEventType,
  type HeartbeatRequest,
  type ObservedNode,
  type P2pEndpoint,
  type P2pPeer,
  type ReportSandboxEventRequest,
} from "../proto/index.ts";
import type { Discovery } from "./discovery/types.ts";
import { SchedulerError } from "./errors.ts";
import { NODE_ID_RE } from "./discovery/static.ts";
import { Picker, type Candidate, type StrategyName } from "./strategy.ts";
import type { SchedulerStore } from "./store/types.ts";
import type { NodeRef, NodeReport } from "./types.ts";

export interface SchedulerCoreOptions {
  strategy: StrategyName;
  /** Freshness of a binding, ms. */
  bindingTtlMs: number;
  /** Age of the last report after which a node is UNHEALTHY, ms. */
  reportTtlMs: number;
  /** Bound on P2P artifact records. */
  maxP2pArtifacts: number;
  /** Clock (tests). */
  now?: () => number;
  random?: () => number;
}

/** Sandbox ids as the nodes make them (E2B: lowercase letters and digits). */
const SANDBOX_ID_RE = /^[a-z0-9]{1,64}$/;

function badRequest(message: string, details: Record<string, unknown> = {}): SchedulerError {
  return new SchedulerError("scheduler.bad_request", message, details);
}

export class SchedulerCore {
  private readonly log: Logger = logger("scheduler");
  private readonly picker: Picker;
  private readonly now: () => number;
  /** When this process started: persisted bindings count their freshness from here at the earliest. */
  private readonly startedAt: number;
  /** Placements since each node's last heartbeat (least_loaded sees them before the next report). */
  private readonly placedSince = new Map<string, number>();
  /** Nodes whose bindings were dropped for a stale report (cleared when they report again). */
  private readonly droppedStale = new Set<string>();
  /** P2P artifacts: "cluster\0backend\0key" -> node ids (insertion order = age, for the bound). */
  private readonly artifacts = new Map<string, Set<string>>();

  constructor(readonly store: SchedulerStore, readonly discovery: Discovery, private readonly o: SchedulerCoreOptions) {
    this.picker = new Picker(o.strategy, o.random);
    this.now = o.now ?? Date.now;
    this.startedAt = this.now();
  }

  /** Status of a node given discovery membership and its last report. */
  statusOf(kind: "active" | "lingering" | null, report: NodeReport | null): NodeStatus {
    if (!report) return NodeStatus.NODE_STATUS_CONNECTING;
    if (this.now() - report.node.lastSeenUnixMs > this.o.reportTtlMs) return NodeStatus.NODE_STATUS_UNHEALTHY;
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
   * Pick a node for a new sandbox among discovered, non-lingering nodes whose reports have not
   * stopped (never-reported nodes count: a node may run without reporting).
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
        load: (s ? s.sandboxCount + s.sandboxStartingCount : 0) + (this.placedSince.get(n.nodeId) ?? 0),
        freeMemoryBytes: s ? Math.max(0, s.memoryTotalBytes - s.memoryUsedBytes) : 0,
      });
    }
    if (candidates.length === 0) {
      const known = this.listNodes().map((n) => n.nodeId);
      throw new SchedulerError("scheduler.no_nodes", known.length ? `no schedulable node: every node (${known.join(", ")}) stopped reporting or is draining` : "no nodes discovered", { nodes: known });
    }
    const pick = this.picker.pick(candidates);
    this.placedSince.set(pick.nodeId, (this.placedSince.get(pick.nodeId) ?? 0) + 1);
    return { nodeId: pick.nodeId, endpoint: pick.endpoint };
  }

  /**
   * The node of a sandbox. A binding not refreshed within binding_ttl (counted from this
   * process's start at the earliest) is dropped.
   * @throws SchedulerError bad_request (malformed id), not_found.
   */
  async lookup(sandboxId: string): Promise<NodeRef> {
    if (!SANDBOX_ID_RE.test(sandboxId)) throw badRequest(`invalid sandbox_id ${JSON.stringify(sandboxId)}: expected 1-64 lowercase letters and digits`, { sandboxId });
    const b = await this.store.getBinding(sandboxId);
    if (!b) throw new SchedulerError("scheduler.not_found", `no node holds sandbox ${sandboxId}`, { sandboxId });
    if (this.now() - Math.max(b.updatedAt, this.startedAt) > this.o.bindingTtlMs) {
      await this.store.deleteBinding(sandboxId, b.nodeId);
      this.log.info({ sandboxId, nodeId: b.nodeId, ageMs: this.now() - b.updatedAt }, "binding expired");
      throw new SchedulerError("scheduler.not_found", `the binding of sandbox ${sandboxId} expired (not refreshed for ${this.o.bindingTtlMs} ms)`, { sandboxId });
    }
    return { nodeId: b.nodeId, endpoint: this.endpointOf(b.nodeId) ?? b.endpoint };
  }

  /** Bind (or refresh) a sandbox to a node. @throws SchedulerError bad_request */
  async recordAssignment(sandboxId: string, node: NodeRef | undefined): Promise<void> {
    if (!SANDBOX_ID_RE.test(sandboxId)) throw badRequest(`invalid sandbox_id ${JSON.stringify(sandboxId)}: expected 1-64 lowercase letters and digits`, { sandboxId });
    if (!node || !NODE_ID_RE.test(node.nodeId)) throw badRequest(`invalid node ${JSON.stringify(node?.nodeId ?? null)} for sandbox ${sandboxId}`, { sandboxId });
    const endpoint = this.endpointOf(node.nodeId) ?? node.endpoint;
    if (!endpoint) throw badRequest(`node ${node.nodeId} is unknown to discovery and the request names no endpoint`, { nodeId: node.nodeId });
    await this.store.putBinding({ sandboxId, nodeId: node.nodeId, endpoint, updatedAt: this.now() });
  }

  /**
   * A node's report: store it (status derived at read time) and make its roster the truth for
   * its bindings. Bindings recorded after the roster was taken (`reported_at`) are kept.
   * @throws SchedulerError bad_request for a missing or malformed node id.
   */
  async heartbeat(req: HeartbeatRequest): Promise<{ added: number; removed: number }> {
    if (!NODE_ID_RE.test(req.nodeId)) throw badRequest(`invalid node_id ${JSON.stringify(req.nodeId)}`, { nodeId: req.nodeId });
    const bad = req.sandboxIds.find((id) => !SANDBOX_ID_RE.test(id));
    if (bad !== undefined) throw badRequest(`invalid sandbox id ${JSON.stringify(bad)} in the roster of node ${req.nodeId}`, { nodeId: req.nodeId });
    const now = this.now();
    const endpoint = this.endpointOf(req.nodeId) ?? "";
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
    await this.store.putReport({ node, p2p: req.p2pEndpoint?.address ? req.p2pEndpoint : null });
    this.placedSince.delete(req.nodeId);
    if (this.droppedStale.delete(req.nodeId)) this.log.info({ nodeId: req.nodeId }, "node reports again");
    const takenAt = Math.min(req.snapshot?.reportedAtUnixMs || now, now);
    const change = await this.store.reconcileRoster(req.nodeId, endpoint, req.sandboxIds, now, takenAt);
    if (change.added || change.removed) this.log.debug({ nodeId: req.nodeId, ...change }, "roster reconciled");
    return change;
  }

  /** Apply lifecycle events: create/resume/fork/pause bind or refresh, delete unbinds. */
  async reportEvents(req: ReportSandboxEventRequest): Promise<void> {
    if (!NODE_ID_RE.test(req.nodeId)) throw badRequest(`invalid node_id ${JSON.stringify(req.nodeId)}`, { nodeId: req.nodeId });
    const endpoint = this.endpointOf(req.nodeId) ?? "";
    for (const ev of req.events) {
      if (!SANDBOX_ID_RE.test(ev.sandboxId)) throw badRequest(`invalid sandbox id ${JSON.stringify(ev.sandboxId)} in an event of node ${req.nodeId}`, { nodeId: req.nodeId });
      if (ev.eventType === SandboxEventType.SANDBOX_EVENT_TYPE_DELETE) await this.store.deleteBinding(ev.sandboxId, req.nodeId);
      else if (ev.eventType !== SandboxEventType.SANDBOX_EVENT_TYPE_UNSPECIFIED) {
        await this.store.putBinding({ sandboxId: ev.sandboxId, nodeId: req.nodeId, endpoint, updatedAt: this.now() });
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
   * A node leaves: forget its report and bindings. An unregister from an older process
   * (service_instance_id differs from the current report's) is ignored.
   * @returns whether anything was removed.
   */
  async unregister(nodeId: string, serviceInstanceId: string): Promise<boolean> {
    if (!NODE_ID_RE.test(nodeId)) throw badRequest(`invalid node_id ${JSON.stringify(nodeId)}`, { nodeId });
    const r = await this.store.getReport(nodeId);
    if (r && serviceInstanceId && r.node.serviceInstanceId && r.node.serviceInstanceId !== serviceInstanceId) {
      this.log.info({ nodeId, serviceInstanceId, current: r.node.serviceInstanceId }, "unregister from an older instance ignored");
      return false;
    }
    await this.store.deleteReport(nodeId);
    const dropped = await this.store.dropNodeBindings(nodeId);
    this.placedSince.delete(nodeId);
    this.log.info({ nodeId, bindings: dropped }, "node unregistered");
    return true;
  }

  /**
   * Drop the bindings of nodes whose reports stopped (once per outage). Called periodically.
   * @returns the node ids handled this time.
   */
  async sweep(): Promise<string[]> {
    const handled: string[] = [];
    for (const r of await this.store.listReports()) {
      const id = r.node.nodeId;
      if (this.now() - r.node.lastSeenUnixMs <= this.o.reportTtlMs || this.droppedStale.has(id)) continue;
      const n = await this.store.dropNodeBindings(id);
      this.droppedStale.add(id);
      handled.push(id);
      this.log.warn({ nodeId: id, lastSeenMsAgo: this.now() - r.node.lastSeenUnixMs, bindings: n }, "node stopped reporting: unschedulable, bindings dropped");
    }
    return handled;
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
    const set = this.artifacts.get(k) ?? new Set<string>();
    this.artifacts.delete(k);
    set.add(nodeId);
    this.artifacts.set(k, set);
    while (this.artifacts.size > this.o.maxP2pArtifacts) this.artifacts.delete(this.artifacts.keys().next().value!);
  }

  forgetArtifact(clusterId: string, backend: string, key: string, nodeId: string): void {
    const k = this.artifactKey(clusterId, backend, key);
    const set = this.artifacts.get(k);
    set?.delete(nodeId);
    if (set?.size === 0) this.artifacts.delete(k);
  }

  async lookupArtifact(clusterId: string, backend: string, key: string, excludeNodeId: string): Promise<P2pPeer[]> {
    const holders = this.artifacts.get(this.artifactKey(clusterId, backend, key));
    if (!holders) return [];
    const peers = await this.p2pPeers(clusterId, backend, excludeNodeId);
    return peers.filter((p) => holders.has(p.nodeId));
  }
}
