/**
 * Where the scheduler keeps bindings (sandbox -> node) and the nodes' last reports, so a
 * restarted scheduler (or another replica, with Redis) routes existing sandboxes at once.
 */
import type { Binding, NodeReport } from "../types.ts";

/** What a roster reconciliation changed. */
export interface RosterChange {
  /** Bindings created or moved to this node. */
  added: number;
  /** Bindings of this node that the roster no longer lists, dropped. */
  removed: number;
}

/**
 * Persistence of the scheduler. Every method may throw SchedulerError `scheduler.store_failed`
 * (the database or Redis server failed); none leaves a half-applied change visible.
 */
export interface SchedulerStore {
  readonly kind: "sqlite" | "redis";
  getBinding(sandboxId: string): Promise<Binding | null>;
  /** Create or replace the binding of `b.sandboxId`. */
  putBinding(b: Binding): Promise<void>;
  /** Remove a binding; with `nodeId`, only when it points at that node. @returns whether one went. */
  deleteBinding(sandboxId: string, nodeId?: string): Promise<boolean>;
  /**
   * Make `roster` the truth for node `nodeId`: every id in it is bound to the node (refreshed to
   * `now`); the node's other bindings last refreshed before `staleBefore` are dropped (newer
   * ones were recorded after the roster was taken).
   */
  reconcileRoster(nodeId: string, endpoint: string, roster: string[], now: number, staleBefore: number): Promise<RosterChange>;
  /** Drop every binding of a node. @returns how many went. */
  dropNodeBindings(nodeId: string): Promise<number>;
  /** Sandbox ids bound to a node, sorted. */
  nodeBindings(nodeId: string): Promise<string[]>;
  countBindings(): Promise<number>;
  putReport(r: NodeReport): Promise<void>;
  getReport(nodeId: string): Promise<NodeReport | null>;
  listReports(): Promise<NodeReport[]>;
  deleteReport(nodeId: string): Promise<void>;
  close(): Promise<void>;
}
