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
  /**
   * Ids of the roster bound to another node that holds them (`held`): left as they are, and the
   * reporting node is told to drop its copies. Ids bound to another node that has not confirmed
   * them yet (a move in progress) are left as they are too, and not listed here.
   */
  foreign: string[];
}

/**
 * Persistence of the scheduler. Every method may throw SchedulerError `scheduler.store_failed`
 * (the database or Redis server failed); none leaves a half-applied change visible.
 */
export interface SchedulerStore {
  readonly kind: "sqlite" | "redis";
  getBinding(sandboxId: string): Promise<Binding | null>;
  /**
   * Create or replace the binding of `b.sandboxId`. A binding that stays on the same node keeps
   * `held` when it had it (a RecordAssignment after the node's own event).
   */
  putBinding(b: Binding): Promise<void>;
  /**
   * `putBinding(b)` unless the sandbox is bound to another node that holds it.
   * @returns whether `b` is the binding now
   */
  claimBinding(b: Binding): Promise<boolean>;
  /**
   * Replace the binding of `to.sandboxId` with `to` only while it names node `fromNodeId`
   * (compare and set: of two concurrent moves one wins).
   * @returns the binding after the call (`to`, or the one that did not name `fromNodeId`); null
   *   when there is none
   */
  moveBinding(fromNodeId: string, to: Binding): Promise<Binding | null>;
  /** Remove a binding; with `nodeId`, only when it points at that node. @returns whether one went. */
  deleteBinding(sandboxId: string, nodeId?: string): Promise<boolean>;
  /**
   * Make `roster` the truth for node `nodeId`: every id in it that is unbound or bound to this
   * node is bound to it, held, refreshed to `now`; ids bound to another node stay there (see
   * RosterChange.foreign); the node's other bindings last refreshed before `staleBefore` are
   * dropped (newer ones were recorded after the roster was taken).
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
