import { AgentEnvError } from "../errors.ts";

/**
 * Every failure of the sandbox-network subsystem. Stable codes:
 * - `net.bad_policy`     an egress-policy entry is malformed (`details.field`, `details.index`, `details.entry`)
 * - `net.bad_config`     a network/pool config value is invalid (`details.key`, `details.value`)
 * - `net.capacity`       every slot index is in use (`details.maxSlots`, `details.inUse`)
 * - `net.setup_failed`   building a slot failed; it was rolled back (`details.idx`, `details.cause`)
 * - `net.command_failed` an `ip`/`iptables-restore` invocation failed (`details.cmd`, `details.rc`, `details.stderr`)
 * - `net.timeout`        a command exceeded its time limit (`details.cmd`, `details.timeoutMs`)
 * - `net.teardown_failed` a namespace or veth survived deletion (`details.netns`, `details.link`)
 * - `net.unknown_slot`   release/update named a slot or sandbox this manager does not own
 * - `net.shut_down`      the manager was used after `shutdown()`
 * - `net.bad_state`      the manager was used before `start()`, or started twice
 * - `net.duplicate_sandbox` the sandbox already holds a slot (`details.sandboxId`)
 * - `net.bad_dns`        a DNS message could not be parsed (`details.offset`)
 * - `net.dns_bind`       the DNS proxy's port cannot be bound (`details.key` = the config key,
 *                        `details.protocol`, `details.address`, `details.port`, `details.errno`)
 */
export class NetError extends AgentEnvError {}
