/**
 * A sandbox's egress policy as the network manager takes it, from what the API hands over (E2B
 * `network` fields and `allowInternetAccess`).
 */
import { parseEgressPolicy, type EgressPolicy } from "../net/index.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { errorMessage } from "../util/error.ts";

/**
 * Check and convert an egress policy body (`allowOut`, `denyOut`, `allow_internet_access`).
 * @throws OrchestratorError `orchestrator.bad_request` naming the bad entry
 */
export function parseNetworkPolicy(p: Record<string, unknown>): EgressPolicy {
  try {
    return parseEgressPolicy(p);
  } catch (e) {
    throw new OrchestratorError("orchestrator.bad_request", errorMessage(e), { network: p }, { cause: e });
  }
}

/**
 * The policy of a sandbox created with `network` and `allowInternetAccess` (null: not given).
 * @throws OrchestratorError `orchestrator.bad_request` naming the bad entry
 */
export function sandboxPolicy(network: Record<string, unknown> | null, allowInternetAccess: boolean | null): EgressPolicy {
  return parseNetworkPolicy({ ...(network ?? {}), ...(allowInternetAccess === null ? {} : { allow_internet_access: allowInternetAccess }) });
}
