/**
 * The gRPC face of the scheduler (nice-grpc): each RPC calls SchedulerCore and maps its errors
 * to status codes (bad_request → INVALID_ARGUMENT, not_found → NOT_FOUND, no_nodes and
 * store_failed → UNAVAILABLE, anything else → INTERNAL).
 */
import { ServerError, Status } from "nice-grpc";
import { logger } from "../../src/observability/log.ts";
import type { SchedulerServiceImplementation } from "../proto/index.ts";
import type { SchedulerCore } from "./core.ts";
import { SchedulerError } from "./errors.ts";

const log = logger("scheduler.grpc");

function toServerError(e: unknown, rpc: string): ServerError {
  if (e instanceof ServerError) return e;
  if (e instanceof SchedulerError) {
    switch (e.code) {
      case "scheduler.bad_request":
        return new ServerError(Status.INVALID_ARGUMENT, e.message);
      case "scheduler.not_found":
        return new ServerError(Status.NOT_FOUND, e.message);
      case "scheduler.no_nodes":
      case "scheduler.store_failed":
        log.warn({ rpc, err: e }, "RPC unavailable");
        return new ServerError(Status.UNAVAILABLE, e.message);
    }
  }
  log.error({ rpc, err: e }, "RPC failed");
  return new ServerError(Status.INTERNAL, `${rpc} failed: ${(e as Error)?.message ?? String(e)}`);
}

/** Wrap every method so thrown errors become gRPC statuses. */
function guarded(impl: SchedulerServiceImplementation): SchedulerServiceImplementation {
  const out: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(impl)) {
    out[name] = async (req: unknown, ctx: unknown) => {
      try {
        return await (fn as (r: unknown, c: unknown) => Promise<unknown>)(req, ctx);
      } catch (e) {
        throw toServerError(e, name);
      }
    };
  }
  return out as unknown as SchedulerServiceImplementation;
}

/** The service implementation over `core`. */
export function schedulerService(core: SchedulerCore): SchedulerServiceImplementation {
  return guarded({
    async schedule() {
      return { node: await core.schedule() };
    },
    async listNodes() {
      return { nodes: core.listNodes() };
    },
    async lookupNode(req) {
      return { node: await core.lookup(req.sandboxId) };
    },
    async recordAssignment(req) {
      await core.recordAssignment(req.sandboxId, req.node);
      return {};
    },
    async heartbeat(req) {
      await core.heartbeat(req);
      return { cpuConfigJson: "" };
    },
    async reportSandboxEvent(req) {
      await core.reportEvents(req);
      return {};
    },
    async listObservedNodes(req) {
      return { nodes: await core.listObserved(req.clusterId) };
    },
    async listP2pPeers(req) {
      return { peers: await core.p2pPeers(req.clusterId, req.backend, req.excludeNodeId) };
    },
    async recordP2pArtifact(req) {
      core.recordArtifact(req.clusterId, req.backend, req.key, req.nodeId);
      return {};
    },
    async forgetP2pArtifact(req) {
      core.forgetArtifact(req.clusterId, req.backend, req.key, req.nodeId);
      return {};
    },
    async lookupP2pArtifact(req) {
      return { peers: await core.lookupArtifact(req.clusterId, req.backend, req.key, req.excludeNodeId) };
    },
    async getNode(req) {
      return { node: await core.getNode(req.nodeId, req.clusterId) };
    },
    async unregisterNode(req) {
      await core.unregister(req.nodeId, req.serviceInstanceId);
      return {};
    },
  });
}
