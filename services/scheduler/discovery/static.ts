/**
 * Static discovery: `[scheduler] nodes`, entries "id=http://host:port".
 */
import { SchedulerError } from "../errors.ts";
import type { NodeRef } from "../../../src/cluster/index.ts";
import type { DiscoveredNodes } from "../types.ts";
import type { Discovery } from "./types.ts";

/** Node ids: what `[node] id` may be (letters, digits, `.`, `_`, `-`). */
export const NODE_ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$/;

/**
 * Parse one static entry.
 * @throws SchedulerError scheduler.bad_config naming the entry.
 */
export function parseNodeEntry(entry: string): NodeRef {
  const eq = entry.indexOf("=");
  const id = eq > 0 ? entry.slice(0, eq).trim() : "";
  const endpoint = eq > 0 ? entry.slice(eq + 1).trim().replace(/\/+$/, "") : "";
  if (!NODE_ID_RE.test(id)) throw new SchedulerError("scheduler.bad_config", `[scheduler] nodes entry ${JSON.stringify(entry)}: expected "id=http://host:port" with an id of letters, digits, '.', '_', '-'`, { entry });
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    throw new SchedulerError("scheduler.bad_config", `[scheduler] nodes entry ${JSON.stringify(entry)}: ${JSON.stringify(endpoint)} is not a URL`, { entry });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new SchedulerError("scheduler.bad_config", `[scheduler] nodes entry ${JSON.stringify(entry)}: the node URL must be http or https`, { entry });
  return { nodeId: id, endpoint };
}

/** Discovery from `[scheduler] nodes`: a fixed list, every node active, sorted by id. */
export class StaticDiscovery implements Discovery {
  readonly mode = "static" as const;
  private readonly list: NodeRef[];

  /** @throws SchedulerError scheduler.bad_config for a malformed or duplicate entry. */
  constructor(entries: string[]) {
    this.list = entries.map(parseNodeEntry).sort((a, b) => (a.nodeId < b.nodeId ? -1 : 1));
    for (let i = 1; i < this.list.length; i++) {
      if (this.list[i]!.nodeId === this.list[i - 1]!.nodeId) throw new SchedulerError("scheduler.bad_config", `[scheduler] nodes names node ${this.list[i]!.nodeId} twice`, { nodeId: this.list[i]!.nodeId });
    }
  }

  nodes(): DiscoveredNodes {
    return { active: [...this.list], lingering: [] };
  }

  async start(): Promise<void> {}
  async close(): Promise<void> {}
}
