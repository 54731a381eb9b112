import type { DiscoveredNodes } from "../types.ts";

/** A source of the nodes the scheduler may place sandboxes on. */
export interface Discovery {
  readonly mode: "static" | "kubernetes";
  /** The current node set (a copy; cheap to call per RPC). */
  nodes(): DiscoveredNodes;
  /** Begin watching (Kubernetes: resolves once the first list arrived). */
  start(): Promise<void>;
  close(): Promise<void>;
}
