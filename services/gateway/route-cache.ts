/**
 * Sandbox -> node routes the gateway learned (create, lookups, list answers), bounded LRU.
 * A sandbox never moves between nodes, so an entry stays right for the sandbox's life: it is
 * dropped when the sandbox is deleted or its node answers 404 for it. While the scheduler is
 * down, known sandboxes keep routing from here.
 */
import type { NodeRef } from "../../src/cluster/index.ts";

/** A bounded LRU map from a key (a sandbox id, a files hash) to the node that serves it. */
export class RouteCache {
  private readonly map = new Map<string, NodeRef>();
  /** @param max entries kept; the least recently used goes first. */
  constructor(private readonly max: number) {}

  /** The node of `sandboxId` (marked recently used), or undefined. */
  get(sandboxId: string): NodeRef | undefined {
    const n = this.map.get(sandboxId);
    if (n) {
      this.map.delete(sandboxId);
      this.map.set(sandboxId, n);
    }
    return n;
  }

  set(sandboxId: string, node: NodeRef): void {
    this.map.delete(sandboxId);
    this.map.set(sandboxId, node);
    if (this.map.size > this.max) this.map.delete(this.map.keys().next().value!);
  }

  delete(sandboxId: string): void {
    this.map.delete(sandboxId);
  }

  get size(): number {
    return this.map.size;
  }
}
