/**
 * The gRPC face of the scheduler (nice-grpc): each RPC calls SchedulerCore and maps its errors
 * to status codes (bad_request → INVALID_ARGUMENT, not_found → NOT_FOUND, no_nodes,
 * unknown_node and node_alive → FAILED_PRECONDITION, store_failed → UNAVAILABLE, anything else → INTERNAL),
 * with the error's code in the trailer `agentenv-error-code`. A request that is not valid
 * protobuf answers INVALID_ARGUMENT (grpc-js alone would answer INTERNAL).
 */
import { ServerError, Status, type CallContext } from "nice-grpc";
import { logger } from "../../src/observability/log.ts";
import { ERROR_CODE_TRAILER, SchedulerDefinition, type SchedulerServiceImplementation } from "../../src/cluster/index.ts";
import type { SchedulerCore } from "./core.ts";
import { SchedulerError, type SchedulerErrorCode } from "./errors.ts";
import { errorMessage } from "../../src/util/error.ts";

const log = logger("scheduler.grpc");

/** gRPC status of each scheduler error code that is not INTERNAL. */
const STATUS: Partial<Record<SchedulerErrorCode, Status>> = {
  "scheduler.bad_request": Status.INVALID_ARGUMENT,
  "scheduler.not_found": Status.NOT_FOUND,
  "scheduler.no_nodes": Status.FAILED_PRECONDITION,
  "scheduler.unknown_node": Status.FAILED_PRECONDITION,
  "scheduler.node_alive": Status.FAILED_PRECONDITION,
  "scheduler.store_failed": Status.UNAVAILABLE,
};

function toServerError(e: unknown, rpc: string, ctx: CallContext): ServerError {
  if (e instanceof ServerError) return e;
  if (e instanceof SchedulerError) {
    ctx.trailer.set(ERROR_CODE_TRAILER, e.code);
    const status = STATUS[e.code];
    if (status !== undefined) {
      if (status === Status.UNAVAILABLE || e.code === "scheduler.unknown_node") log.warn({ rpc, err: e }, "RPC refused");
      return new ServerError(status, e.message);
    }
  }
  log.error({ rpc, err: e }, "RPC failed");
  return new ServerError(Status.INTERNAL, `${rpc} failed: ${errorMessage(e)}`);
}

/** Marker of a request body that did not decode (see tolerantDefinition). */
const MALFORMED = Symbol("malformed request");
type Malformed = { [MALFORMED]: string };

function isMalformed(req: unknown): req is Malformed {
  return typeof req === "object" && req !== null && MALFORMED in req;
}

/**
 * SchedulerDefinition whose request decoders never throw: a body that is not the request
 * message decodes to a marker the handlers refuse with INVALID_ARGUMENT.
 */
function tolerantDefinition(): typeof SchedulerDefinition {
  const methods: Record<string, unknown> = {};
  for (const [key, m] of Object.entries(SchedulerDefinition.methods)) {
    const decode = m.requestType.decode.bind(m.requestType) as (input: Uint8Array, length?: number) => unknown;
    methods[key] = {
      ...m,
      requestType: {
        ...m.requestType,
        decode: (input: Uint8Array, length?: number) => {
          try {
            return decode(input, length);
          } catch (e) {
            return { [MALFORMED]: errorMessage(e) };
          }
        },
      },
    };
  }
  return { ...SchedulerDefinition, methods } as unknown as typeof SchedulerDefinition;
}

/** The definition to serve with schedulerService (tolerant request decoding). */
export const servedDefinition = tolerantDefinition;

/** Wrap every method so thrown errors become gRPC statuses. */
function guarded(impl: SchedulerServiceImplementation): SchedulerServiceImplementation {
  const out: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(impl)) {
    out[name] = async (req: unknown, ctx: CallContext) => {
      try {
        if (isMalformed(req)) throw new SchedulerError("scheduler.bad_request", `${name}: the request is not a valid protobuf message: ${req[MALFORMED]}`);
        return await (fn as (r: unknown, c: unknown) => Promise<unknown>)(req, ctx);
      } catch (e) {
        throw toServerError(e, name, ctx);
      }
    };
  }
  return out as unknown as SchedulerServiceImplementation;
}

/** The service implementation over `core` (serve it with `servedDefinition()`). */
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
      const change = await core.heartbeat(req);
      return { cpuConfigJson: "", foreignSandboxIds: change.foreign };
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
      await core.unregister(req.nodeId, req.serviceInstanceId, req.keepBindings);
      return {};
    },
    async rebindSandbox(req) {
      return core.rebind(req.sandboxId, req.fromNodeId);
    },
  });
}
