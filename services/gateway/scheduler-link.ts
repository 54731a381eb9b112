/**
 * The gateway's view of the scheduler: RPCs bounded by scheduler_timeout_ms; a channel that is
 * down (UNAVAILABLE) is tried again every scheduler_retry_ms within that bound. Failures are
 * told apart by the scheduler's error code (the `agentenv-error-code` trailer), never by message
 * text: not_found → null, no_nodes → `gateway.no_nodes` at once, bad_request →
 * `gateway.bad_request`, anything else → `gateway.scheduler_unavailable`. The node list is
 * cached for node_list_ttl_ms and kept (last known) while the scheduler is down.
 */
import { ClientError, createClient, Metadata, Status, type Channel } from "nice-grpc";
import { ERROR_CODE_TRAILER, NodeStatus, SchedulerDefinition, schedulerChannel, untilAnswered, type NodeRef, type ObservedNode, type SchedulerClient } from "../../src/cluster/index.ts";
import { GatewayError } from "./errors.ts";
import { errorMessage } from "../../src/util/error.ts";

/** Settings of the link (from GatewayConfig). */
export interface SchedulerLinkOptions {
  /** Scheduler gRPC address. */
  endpoint: string;
  /** Bound on one RPC, retries included, ms. */
  timeoutMs: number;
  /** Pause between tries while the channel is down, ms. */
  retryMs: number;
  /** Reuse of the node list, ms. */
  nodeListTtlMs: number;
}

/** The nodes a cluster-wide read asks, and those it leaves out. */
export interface ClusterNodes {
  /** Discovered nodes to ask. */
  live: NodeRef[];
  /** Discovered nodes the scheduler reports UNHEALTHY (reports stopped, or left): not asked. */
  unhealthy: NodeRef[];
  /** Ids of live nodes that are draining (LINGERING): asked, never given new sandboxes. */
  draining: Set<string>;
}

/** A gRPC client of the scheduler for the gateway (one channel; close() releases it). */
export class SchedulerLink {
  private readonly channel: Channel;
  private readonly client: SchedulerClient;
  private nodes: { at: number; set: ClusterNodes } | null = null;
  /** A refresh of `nodes` in progress (seemsUnhealthy starts at most one). */
  private refreshing: Promise<unknown> | null = null;

  constructor(private readonly o: SchedulerLinkOptions) {
    this.channel = schedulerChannel(o.endpoint);
    this.client = createClient(SchedulerDefinition, this.channel);
  }

  get endpoint(): string {
    return this.o.endpoint;
  }

  /**
   * One RPC within timeoutMs. UNAVAILABLE is tried again every retryMs inside that budget: a
   * channel that saw the scheduler go away fails calls at once until it has reconnected.
   * @returns null for NOT_FOUND.
   * @throws GatewayError no_nodes, bad_request, scheduler_unavailable.
   */
  private async call<T>(what: string, fn: (o: { signal: AbortSignal; onTrailer: (t: Metadata) => void }) => Promise<T>): Promise<T | null> {
    const signal = AbortSignal.timeout(this.o.timeoutMs);
    let code: string | undefined; // the scheduler's error code (services/scheduler/errors.ts), when it sent one
    const onTrailer = (t: Metadata) => (code = t.get(ERROR_CODE_TRAILER));
    try {
      // an UNAVAILABLE with an error code is the scheduler's own answer (its store failed): not retried
      return await untilAnswered(() => fn({ signal, onTrailer }), signal, this.o.retryMs, () => code === undefined);
    } catch (e) {
      if (e instanceof ClientError && e.code === Status.NOT_FOUND) return null;
      if (code === "scheduler.no_nodes") throw new GatewayError("gateway.no_nodes", (e as ClientError).details, { scheduler: this.o.endpoint });
      if (e instanceof ClientError && e.code === Status.INVALID_ARGUMENT) throw new GatewayError("gateway.bad_request", e.details);
      const why = e instanceof ClientError ? `${Status[e.code]}: ${e.details}` : ["AbortError", "TimeoutError"].includes(String((e as { name?: unknown } | null)?.name)) ? `no answer within ${this.o.timeoutMs} ms` : errorMessage(e);
      const status = e instanceof ClientError ? { grpcStatus: Status[e.code] } : {};
      throw new GatewayError("gateway.scheduler_unavailable", `the scheduler at ${this.o.endpoint} is unavailable (${what}: ${why})`, { scheduler: this.o.endpoint, ...(code ? { schedulerCode: code } : {}), ...status });
    }
  }

  /** A node for a new sandbox. @throws GatewayError scheduler_unavailable, no_nodes */
  async schedule(metadata: Record<string, string>): Promise<NodeRef> {
    const r = await this.call("Schedule", (o) => this.client.schedule({ hint: { newSandbox: { metadata } } }, o));
    if (!r?.node) throw new GatewayError("gateway.no_nodes", "the scheduler returned no node");
    return r.node;
  }

  /** The node of a sandbox, or null when none holds it. @throws GatewayError scheduler_unavailable, bad_request */
  async lookup(sandboxId: string): Promise<NodeRef | null> {
    const r = await this.call("LookupNode", (o) => this.client.lookupNode({ sandboxId }, o));
    return r?.node ?? null;
  }

  /**
   * Move sandbox `sandboxId` off node `fromNodeId`, which is gone (RebindSandbox): the node it is
   * bound to now and whether this call moved it; null when it stays (no binding, the node is not
   * gone long enough, no other node can take it, or a scheduler without RebindSandbox).
   * @throws GatewayError scheduler_unavailable, bad_request
   */
  async rebind(sandboxId: string, fromNodeId: string): Promise<{ node: NodeRef; moved: boolean } | null> {
    try {
      const r = await this.call("RebindSandbox", (o) => this.client.rebindSandbox({ sandboxId, fromNodeId }, o));
      return r?.node ? { node: r.node, moved: r.moved } : null;
    } catch (e) {
      const d = e instanceof GatewayError ? (e.details as { schedulerCode?: string; grpcStatus?: string }) : {};
      if (e instanceof GatewayError && (e.code === "gateway.no_nodes" || d.schedulerCode === "scheduler.node_alive" || d.grpcStatus === "UNIMPLEMENTED")) return null;
      throw e;
    }
  }

  /** Bind a sandbox to its node. @throws GatewayError scheduler_unavailable, bad_request */
  async record(sandboxId: string, node: NodeRef): Promise<void> {
    await this.call("RecordAssignment", (o) => this.client.recordAssignment({ sandboxId, node }, o));
  }

  /**
   * Discovered nodes split by health (cached; the last known set while the scheduler is down).
   * @throws GatewayError scheduler_unavailable when the scheduler is down and no set is known.
   */
  async listNodes(): Promise<ClusterNodes> {
    if (this.nodes && performance.now() - this.nodes.at < this.o.nodeListTtlMs) return this.nodes.set;
    try {
      const [listed, observed] = await Promise.all([this.call("ListNodes", (o) => this.client.listNodes({}, o)), this.observed()]);
      const having = (s: NodeStatus) => new Set(observed.filter((n) => n.snapshot?.status === s).map((n) => n.nodeId));
      const down = having(NodeStatus.NODE_STATUS_UNHEALTHY);
      const all = listed?.nodes ?? [];
      this.nodes = { at: performance.now(), set: { live: all.filter((n) => !down.has(n.nodeId)), unhealthy: all.filter((n) => down.has(n.nodeId)), draining: having(NodeStatus.NODE_STATUS_LINGERING) } };
    } catch (e) {
      if (!this.nodes) throw e;
    }
    return this.nodes!.set;
  }

  /**
   * Whether the last known node list marks `nodeId` UNHEALTHY (false when none is known). Never
   * waits for the scheduler: a list older than node_list_ttl_ms is refreshed in the background.
   */
  seemsUnhealthy(nodeId: string): boolean {
    if ((!this.nodes || performance.now() - this.nodes.at >= this.o.nodeListTtlMs) && !this.refreshing) {
      this.refreshing = this.listNodes()
        .catch(() => {})
        .finally(() => (this.refreshing = null));
    }
    return this.nodes?.set.unhealthy.some((n) => n.nodeId === nodeId) ?? false;
  }

  /** Every node the scheduler observes, with its derived status. @throws GatewayError scheduler_unavailable */
  async observed(): Promise<ObservedNode[]> {
    return (await this.call("ListObservedNodes", (o) => this.client.listObservedNodes({ clusterId: "" }, o)))?.nodes ?? [];
  }

  /** One node, or null. @throws GatewayError scheduler_unavailable */
  async node(nodeId: string): Promise<ObservedNode | null> {
    return (await this.call("GetNode", (o) => this.client.getNode({ nodeId, clusterId: "" }, o)))?.node ?? null;
  }

  close(): void {
    this.channel.close();
  }
}
