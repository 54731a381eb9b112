/**
 * Placement strategies: pick one node among the candidates (already filtered to schedulable
 * nodes, sorted by id).
 */
import type { NodeRef } from "../../src/cluster/index.ts";

export type StrategyName = "round_robin" | "random" | "least_loaded";
export const STRATEGIES: readonly StrategyName[] = ["round_robin", "random", "least_loaded"];

/** A candidate with the load figures least_loaded needs (null: the node never reported). */
export interface Candidate extends NodeRef {
  /** Running + starting sandboxes from the last heartbeat, plus placements made since it. */
  load: number;
  /** memory_total - memory_used from the last heartbeat, bytes; 0 when unknown. */
  freeMemoryBytes: number;
}

/** Stateful picker (round_robin keeps its position). */
export class Picker {
  private next = 0;
  constructor(readonly strategy: StrategyName, private readonly random: () => number = Math.random) {}

  /** Pick one of `c` (non-empty). */
  pick(c: Candidate[]): Candidate {
    switch (this.strategy) {
      case "round_robin":
        return c[this.next++ % c.length]!;
      case "random":
        return c[Math.floor(this.random() * c.length) % c.length]!;
      case "least_loaded": {
        let best = c[0]!;
        for (const n of c.slice(1)) {
          if (n.load < best.load || (n.load === best.load && n.freeMemoryBytes > best.freeMemoryBytes)) best = n;
        }
        return best;
      }
    }
  }
}
