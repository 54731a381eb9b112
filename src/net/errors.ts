import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** Every failure of the sandbox-network subsystem. Adding a code: see src/errors.ts. */
export const NET_ERRORS = {
  "net.bad_policy": "an egress-policy entry is malformed (details.field, index, entry)",
  "net.bad_config": "a network/pool config value is invalid (details.key, value)",
  "net.capacity": "every slot index is in use (details.maxSlots, inUse)",
  "net.setup_failed": "building a slot failed; it was rolled back (details.idx, cause)",
  "net.command_failed": "an ip/iptables-restore invocation failed (details.cmd, rc, stderr)",
  "net.timeout": "a command exceeded its time limit (details.cmd, timeoutMs)",
  "net.teardown_failed": "a namespace or veth survived deletion (details.netns, link)",
  "net.unknown_slot": "release/update named a slot or sandbox this manager does not own",
  "net.shut_down": "the manager was used after shutdown()",
  "net.bad_state": "the manager was used before start(), or started twice",
  "net.duplicate_sandbox": "the sandbox already holds a slot (details.sandboxId)",
  "net.bad_dns": "a DNS message could not be parsed (details.offset)",
  "net.dns_bind": "the DNS proxy port cannot be bound (details.key, protocol, address, port, errno)",
} as const satisfies ErrorTable;
/** A NetError code. */
export type NetErrorCode = keyof typeof NET_ERRORS;

/** A failure of this subsystem: one of `NET_ERRORS` as `code`, the offending values in `details`. */
export class NetError extends AgentEnvError<NetErrorCode> {}
