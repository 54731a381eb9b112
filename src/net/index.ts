/**
 * Sandbox networking (issue 5): one network slot per sandbox, a warm pool of slots, per-sandbox
 * egress policy, inbound access from the node, and clean teardown (also after a crash).
 *
 * ## API for the orchestrator
 * ```ts
 * const net = new NetworkManager(netConfigFromConfig(cfg), db);
 * await net.start();                                   // reap a crashed run, node rules, fill pool
 * await net.start({ keep: [{ sandboxId, policy? }] });  // ... but adopt these sandboxes' slots (issue 27)
 * const policy = parseCreateNetwork(createBody);      // 400 on NetError code "net.bad_policy"
 * const slot = await net.allocate(policy, sandboxId);  // NetError "net.capacity" when full
 * vmm.boot({ ..., net: netSpec(slot) });               // QEMU/Firecracker run in slot.netnsPath
 * const { host, port } = guestAddress(slot, 49983);    // node/proxy connect here
 * await net.updatePolicy(sandboxId, parseEgressPolicy(putBody)); // PUT /sandboxes/{id}/network
 * await net.release(sandboxId);                        // back to the pool (reset)
 * await net.shutdown();                                // after the last sandbox is gone
 * await net.detach();                                  // or: leave every slot to the next node
 * ```
 * `allow_internet_access: false` at create (top level or in `network`) is part of the policy
 * (`allowInternetAccess`). Stop the sandbox's VM before `release()`: the tap is recreated.
 * One NetworkManager per name prefix per host: `start()` reaps everything with its prefix.
 *
 * ## Several nodes on one host: `[network] name_prefix` must differ per node
 * `start()` deletes every netns and host veth named `<name_prefix><digits>` and every node-netns
 * iptables chain whose name starts with `<name_prefix>`, whoever made them: it cannot tell a
 * crashed run of this node from another node that is running. A second node started on the same
 * host (same network namespace) with the same prefix destroys the first node's sandbox networks.
 * So give each node its own `name_prefix`, and never one that is a prefix of another node's
 * (`aenv-` vs `aenv-b`): chain reaping and the `<prefix>+` interface wildcard of the node rules
 * match by leading characters, so `aenv-` would also remove and filter `aenv-b`'s objects. Use
 * equal-length prefixes such as `aenva-` / `aenvb-`. The DNS proxy port
 * (`network.egress.dns_proxy_port`) must differ per node too (or be 0); a taken port fails
 * `start()` with NetError `net.dns_bind`. This module takes no lock; guarding against two nodes
 * with the same settings is the node's job.
 *
 * ## Slot layout
 * See slot.ts: netns `<prefix><idx>`, veth /31 from `[network.internal].veth_cidr`, a host
 * address from `host_interaction_cidr` DNATed to the guest, tap `tap0` 169.254.0.22/30, guest
 * 169.254.0.21 (same in every slot), MAC 02:ae:<idx>. The VMM starts inside the netns and opens
 * the tap by name.
 *
 * ## Egress policy
 * In the slot netns, every guest packet (not only the first of a connection) walks: allowOut
 * CIDRs → addresses learned for allowOut domains → `always_denied_cidrs` → denyOut →
 * `allow_internet_access`/`default_action`. First match wins, so allow beats deny. Replies to
 * connections the node opened to the guest always pass. Slot-to-slot traffic is dropped in the
 * node's FORWARD chain whatever the policies say; the node itself accepts from slots only replies
 * and DNS-proxy queries.
 *
 * ## Domain rules: enforced on DNS-resolved addresses (not SNI/Host inspection). Why:
 * - It covers every protocol (TCP, UDP, QUIC), not only TLS and plain HTTP; SNI is absent from
 *   ECH/QUIC-initial-less flows and Host only exists in cleartext HTTP.
 * - Enforcement stays in the kernel (one iptables chain per slot) with no proxy on the data path;
 *   a transparent SNI proxy would terminate every guest connection in the node.
 * - SNI/Host are chosen by the guest and can name an allowed domain while the packet goes to any
 *   address; with DNS the node picks the resolver answer and admits only those addresses.
 * Trade-offs, stated: an admitted address serves every name hosted on it (shared CDN IPs), and an
 *   admitted address stays open for max(TTL, `dns_min_ttl_secs`).
 * The slot DNATs the guest's port 53, UDP and TCP (whatever server it asks), to the node's DnsProxy, which
 * installs the answer's A records in the slot's AENV-DNS chain before relaying the answer.
 *
 * ## Crash safety
 * Allocations are persisted in SQLite (`net_slots`). All per-slot rules live in the slot netns, so
 * deleting the netns removes them. `start()` deletes every `<prefix><digits>` netns and host link
 * and every node chain starting with the prefix, then clears the table.
 *
 * ## Limits (known, by design for now)
 * - IPv4 only: slots disable IPv6; allowOut/denyOut reject IPv6 entries.
 * - Conntrack entries of a slot are not flushed when it is reused; harmless for egress, because
 *   guest-originated packets are checked on every packet, not only the first.
 * - Denied TCP is answered with a reset, other protocols with ICMP admin-prohibited; slot-to-slot
 *   and slot-to-node traffic is silently dropped.
 *
 * Errors: `NetError` (errors.ts) with the codes listed there.
 */
export { type NetConfig, netConfigFromConfig, rangeCapacity, TAP_LINK, validateNetConfig } from "./config.ts";
export { NetError } from "./errors.ts";
export { NetworkManager, type NetStartReport, type NetStats } from "./manager.ts";
export type { KeepSlot, LostSlot } from "./adopt.ts";
export type { ReapReport } from "./netns.ts";
export type { SlotRow, SlotState } from "./store.ts";
export { defaultPolicy, type EgressPolicy, parseCreateNetwork, parseEgressPolicy, policyToJson } from "./policy.ts";
export { domainMatches, type DomainPattern } from "./domain.ts";
export { type AllocatedSlot, GATEWAY_IP, GUEST_IP, guestAddress, netSpec, type Slot, slotLayout, TAP_MAC, TAP_NAME, TAP_PREFIX_LEN } from "./slot.ts";
export { makeTapNamespace, reapTapNamespaces, type TapNamespace } from "./tapns.ts";
export { maskNetwork, type EgressProxy, type HostRule } from "./egress/index.ts";
export { maskedHost } from "./ingress.ts";
