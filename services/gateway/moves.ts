/**
 * Connects to sandboxes whose node is gone (cross-node resume). A connect or resume (E2B
 * `Sandbox.connect`) of a sandbox whose node the scheduler reports UNHEALTHY, or that refuses
 * the request, asks the scheduler to move it (RebindSandbox; the scheduler does so only when the
 * node has been silent for `rebind_after_secs`, and binds the sandbox to a node it picks). That
 * node gets the connect with TAKE_OVER_HEADER: it takes the paused sandbox over from the shared
 * snapshot store (pause snapshot + record) and resumes it under the same id. A node that finds
 * no pause snapshot of it there answers 404: the move is undone (the binding goes back to the
 * gone node, which keeps the sandbox when it returns) and the client gets the 502 naming the
 * gone node, as without a move. Any other answer of the new node stands: its heartbeat roster
 * confirms the binding, or drops it when the node holds nothing.
 */
import type { Logger } from "pino";
import { TAKE_OVER_HEADER, type NodeRef } from "../../src/cluster/index.ts";
import type { LruMap } from "../../src/util/lru.ts";
import { GatewayError } from "./errors.ts";
import { neverReached, nodeFailureOf } from "./forward.ts";
import type { SchedulerLink } from "./scheduler-link.ts";

/** What a connect that may move needs of the gateway. */
export interface MoveDeps {
  scheduler: SchedulerLink;
  routes: LruMap<string, NodeRef>;
  log: Logger;
  /** Send the connect (its body already read) to `node`, with `extra` headers. @throws GatewayError node_unreachable */
  send(node: NodeRef, extra?: Record<string, string>): Promise<Response>;
}

/**
 * Connect or resume sandbox `id`, bound to `node`: there while it answers or is not known gone,
 * else on the node the scheduler moves it to.
 * @returns the answer and the node that gave it
 * @throws GatewayError node_unreachable (its node does not answer and the sandbox stays bound
 *   to it), scheduler_unavailable
 */
export async function connectAnywhere(d: MoveDeps, id: string, node: NodeRef): Promise<{ res: Response; node: NodeRef }> {
  if (d.scheduler.seemsUnhealthy(node.nodeId)) return moveAndConnect(d, id, node, null);
  try {
    return { res: await d.send(node), node };
  } catch (e) {
    if (!neverReached(nodeFailureOf(e))) throw e;
    return moveAndConnect(d, id, node, e);
  }
}

/** Ask the scheduler to move `id` off `from`; connect there, or at `from` when it stays. `failure`: how `from` failed already, if it was tried. */
async function moveAndConnect(d: MoveDeps, id: string, from: NodeRef, failure: unknown): Promise<{ res: Response; node: NodeRef }> {
  const to = await d.scheduler.rebind(id, from.nodeId);
  if (!to || to.node.nodeId === from.nodeId) {
    if (failure) throw failure;
    return { res: await d.send(from), node: from };
  }
  d.routes.set(id, to.node);
  d.log.warn({ sandboxId: id, from: from.nodeId, to: to.node.nodeId, movedHere: to.moved }, "connect of a sandbox whose node is gone: sent to the node the scheduler moved it to");
  const res = await d.send(to.node, { [TAKE_OVER_HEADER]: from.nodeId });
  if (res.status !== 404) return { res, node: to.node };
  await res.body?.cancel();
  // nothing to resume it from: it stays the gone node's
  d.routes.set(id, from);
  if (to.moved) {
    await d.scheduler.record(id, from).catch((e) => d.log.warn({ sandboxId: id, nodeId: from.nodeId, err: e }, "undoing a move failed: the new node's next roster drops the binding"));
  }
  if (failure) throw failure;
  throw new GatewayError("gateway.node_unreachable", `node ${from.nodeId} (${from.endpoint}) is gone, and the shared snapshot store has no pause snapshot of sandbox ${id} to resume it on another node`, { nodeId: from.nodeId, failure: "unreachable" });
}
