/**
 * The gateway's view of the scheduler: RPCs bounded by scheduler_timeout_ms, NOT_FOUND turned
 * into null, every other failure into `gateway.scheduler_unavailable`; the node list cached for
 * node_list_ttl_ms and kept (last known) while the scheduler is down.
 */
import { ClientError, createClient, Status, type Channel } from "nice-grpc";
import { SchedulerDefinition, schedulerChannel, type ObservedNode, type SchedulerClient } from "../../src/cluster/index.ts";
import { GatewayError } from "./errors.ts";
import type { NodeRef } from "../scheduler/types.ts";

export class SchedulerLink {
  private readonly channel: Channel;
  private readonly client: SchedulerClient;
  private nodes: { at: number; list: NodeRef[] } | null = null;

  constructor(readonly endpoint: string, private readonly timeoutMs: number, private readonly nodeListTtlMs: number) {
    this.channel = schedulerChannel(endpoint);
    this.client = createClient(SchedulerDefinition, this.channel);
  }

  /**
   * One RPC within timeoutMs. UNAVAILABLE is retried every 100 ms inside that budget: a channel
   * that saw the scheduler go away fails calls at once until it has reconnected.
   */
  private async call<T>(what: string, fn: (signal: AbortSignal) => Promise<T>): Promise<T | null> {
    const signal = AbortSignal.timeout(this.timeoutMs);
    try {
      for (;;) {
        try {
          return await fn(signal);
        } catch (e) {
          if (!(e instanceof ClientError && e.code === Status.UNAVAILABLE) || signal.aborted) throw e;
          await Bun.sleep(100);
          if (signal.aborted) throw e;
        }
      }
    } catch (e) {
      if (e instanceof ClientError && e.code === Status.NOT_FOUND) return null;
      if (e instanceof ClientError && e.code === Status.INVALID_ARGUMENT) throw new GatewayError("gateway.bad_request", e.details);
      const why = e instanceof ClientError ? `${Status[e.code]}: ${e.details}` : (e as Error)?.name === "AbortError" || (e as Error)?.name === "TimeoutError" ? `no answer within ${this.timeoutMs} ms` : String((e as Error)?.message ?? e);
      throw new GatewayError("gateway.scheduler_unavailable", `the scheduler at ${this.endpoint} is unavailable (${what}: ${why})`, { scheduler: this.endpoint });
    }
  }

  /** A node for a new sandbox. @throws GatewayError scheduler_unavailable, no_nodes */
  async schedule(metadata: Record<string, string>): Promise<NodeRef> {
    try {
      const r = await this.call("Schedule", (signal) => this.client.schedule({ hint: { newSandbox: { metadata } } }, { signal }));
      if (!r?.node) throw new GatewayError("gateway.no_nodes", "the scheduler returned no node");
      return r.node;
    } catch (e) {
      if (e instanceof GatewayError && e.code === "gateway.scheduler_unavailable" && /UNAVAILABLE: no (schedulable node|nodes discovered)/.test(e.message)) {
        throw new GatewayError("gateway.no_nodes", e.message);
      }
      throw e;
    }
  }

  /** The node of a sandbox, or null when none holds it. */
  async lookup(sandboxId: string): Promise<NodeRef | null> {
    const r = await this.call("LookupNode", (signal) => this.client.lookupNode({ sandboxId }, { signal }));
    return r?.node ?? null;
  }

  /** Bind a sandbox to its node. */
  async record(sandboxId: string, node: NodeRef): Promise<void> {
    await this.call("RecordAssignment", (signal) => this.client.recordAssignment({ sandboxId, node }, { signal }));
  }

  /** Discovered nodes (cached; the last known list while the scheduler is down). */
  async listNodes(): Promise<NodeRef[]> {
    if (this.nodes && performance.now() - this.nodes.at < this.nodeListTtlMs) return this.nodes.list;
    try {
      const r = await this.call("ListNodes", (signal) => this.client.listNodes({}, { signal }));
      this.nodes = { at: performance.now(), list: r?.nodes ?? [] };
    } catch (e) {
      if (!this.nodes) throw e;
    }
    return this.nodes!.list;
  }

  async observed(): Promise<ObservedNode[]> {
    return (await this.call("ListObservedNodes", (signal) => this.client.listObservedNodes({ clusterId: "" }, { signal })))?.nodes ?? [];
  }

  /** One node, or null. */
  async node(nodeId: string): Promise<ObservedNode | null> {
    return (await this.call("GetNode", (signal) => this.client.getNode({ nodeId, clusterId: "" }, { signal })))?.node ?? null;
  }

  close(): void {
    this.channel.close();
  }
}
