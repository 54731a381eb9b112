/**
 * Plain data of the scheduler. Times are unix milliseconds.
 */
import type { NodeRef, ObservedNode, P2pEndpoint } from "../../src/cluster/index.ts";

/** Where a sandbox lives. */
export interface Binding {
  sandboxId: string;
  nodeId: string;
  /** The node's endpoint when the binding was made (discovery's current one wins at lookup). */
  endpoint: string;
  /** Last refresh (RecordAssignment, a roster listing it, a sandbox event), unix ms. */
  updatedAt: number;
  /**
   * The node itself said it holds the sandbox (its roster listed it, or it reported an event of
   * it); false for a binding the gateway recorded (a create's RecordAssignment, a rebind) until
   * the node confirms it. Another node's roster never takes a held binding over.
   */
  held: boolean;
}

/** A node's last report, as persisted: the proto record plus its P2P endpoint. */
export interface NodeReport {
  node: ObservedNode;
  p2p: P2pEndpoint | null;
  /**
   * When the node said it leaves (UnregisterNode), unix ms; null while it reports. A node that
   * left is never scheduled until its next heartbeat clears this.
   */
  leftAtUnixMs: number | null;
}

/** What discovery currently says: nodes to schedule on, and nodes draining (terminating). */
export interface DiscoveredNodes {
  active: NodeRef[];
  lingering: NodeRef[];
}
