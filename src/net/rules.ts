/**
 * iptables-restore scripts (text) for the node's namespace and for each slot's namespace.
 * Pure functions: the caller feeds them to `iptables-restore --noflush`. In --noflush mode a chain
 * declaration (":NAME - [0:0]") empties that chain, so a script that declares a chain and then
 * appends to it replaces the chain atomically (one commit per table) without touching others.
 *
 * Where the rules live and why:
 * - Egress policy, DNAT of inbound traffic and SNAT of outbound traffic live INSIDE the slot's
 *   netns (fixed chain names). The guest cannot reach them, deleting the netns deletes them, so a
 *   crashed node leaves no per-slot rule behind in the node's tables.
 * - The node's namespace holds three shared chains named `<prefix>fwd`, `<prefix>in`,
 *   `<prefix>post`, matching slot veths by the interface wildcard `<prefix>+`: slot-to-slot
 *   forwarding is dropped, the node itself accepts only replies and DNS-proxy queries from slots,
 *   the DNS-proxy port accepts nothing from elsewhere, and slot traffic leaving the node is
 *   masqueraded.
 * - Each DNS-learned allow rule carries, as an iptables comment, the name it was learned for and
 *   when it expires (`aenv-dns <qname> <unix ms>`): the kernel's copy is the persisted one, so a
 *   node that adopts a running slot reads them back (`parseDnsAllowed`) instead of keeping them
 *   in a table of its own (issue 27).
 */
import type { NetConfig } from "./config.ts";
import { type Cidr, formatCidr } from "./ipv4.ts";
import type { EgressPolicy } from "./policy.ts";
import type { Slot } from "./slot.ts";
import { egressChain } from "./egress/redirect.ts";

/** Filter chain in the slot: everything the guest sends (jumped to from FORWARD -i tap0). */
export const CHAIN_EGRESS = "AENV-EGRESS";
/** Filter chain in the slot: the sandbox's policy; replaced as a whole on update. */
export const CHAIN_POLICY = "AENV-POLICY";
/** Filter chain in the slot: addresses learned from DNS answers for allowOut domains. */
export const CHAIN_DNS = "AENV-DNS";
/**
 * Filter chain in the slot: how a denied packet is refused. TCP gets a reset, the rest an ICMP
 * admin-prohibited; both fail fast in the guest. (ICMP errors are rate-limited per destination,
 * so TCP answered only by ICMP would often hang until the guest's SYN retries time out.)
 */
export const CHAIN_DENY = "AENV-DENY";

const DENY = CHAIN_DENY;

/** One address admitted through a DNS answer: for which name, until when (unix ms). */
export interface DnsAllowed {
  ip: string;
  qname: string;
  expiresAt: number;
}

/** First word of the comment on every DNS-learned rule. */
export const DNS_COMMENT_TAG = "aenv-dns";
/** Names written into a rule comment as they are (iptables comments: at most 256 bytes, no quotes). */
const COMMENT_NAME = /^[A-Za-z0-9._-]{1,200}$/;
/** What stands for a name that cannot go into a comment (it matches no allowOut domain later). */
const UNNAMED = "?";

function dnsRule(e: DnsAllowed): string {
  const name = COMMENT_NAME.test(e.qname) ? e.qname : UNNAMED;
  return `-A ${CHAIN_DNS} -d ${e.ip}/32 -m comment --comment "${DNS_COMMENT_TAG} ${name} ${Math.floor(e.expiresAt)}" -j ACCEPT`;
}

/**
 * The DNS-learned addresses in `iptables-save` output of a slot's filter table (the AENV-DNS
 * rules and their comments). A rule without our comment (made before comments were written)
 * gets name "?" and expires at `fallbackExpiresAt`.
 */
export function parseDnsAllowed(save: string, fallbackExpiresAt: number): DnsAllowed[] {
  const out: DnsAllowed[] = [];
  const re = new RegExp(`^-A ${CHAIN_DNS} -d ([0-9.]+)/32(?: -m comment --comment "?${DNS_COMMENT_TAG} (\\S+) (\\d+)"?)? -j ACCEPT$`);
  for (const line of save.split("\n")) {
    const m = re.exec(line.trim());
    if (!m) continue;
    out.push(m[2] ? { ip: m[1]!, qname: m[2], expiresAt: Number(m[3]) } : { ip: m[1]!, qname: UNNAMED, expiresAt: fallbackExpiresAt });
  }
  return out;
}

/** Names of the node-namespace chains for a prefix (`egr`: the egress interceptor's redirects, egress/redirect.ts). */
export function hostChains(prefix: string): { fwd: string; input: string; post: string; egr: string } {
  return { fwd: `${prefix}fwd`, input: `${prefix}in`, post: `${prefix}post`, egr: egressChain(prefix) };
}

/**
 * Node-namespace rules per table (the lines between `*table` and `COMMIT`): chain declarations
 * (which empty the chain in --noflush mode), their rules, and the jumps into them.
 */
export function hostRuleLines(cfg: NetConfig): { filter: string[]; nat: string[] } {
  const { fwd, input, post, egr } = hostChains(cfg.namePrefix);
  const ifw = `${cfg.namePrefix}+`;
  const filter = [
    `:${fwd} - [0:0]`,
    `:${input} - [0:0]`,
    `-A ${fwd} -i ${ifw} -o ${ifw} -j DROP`,
    `-A ${fwd} -i ${ifw} -j ACCEPT`,
    `-A ${fwd} -o ${ifw} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT`,
    `-A ${input} -i ${ifw} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT`,
  ];
  if (cfg.dns.enabled) {
    for (const proto of ["udp", "tcp"]) {
      filter.push(`-A ${input} -i ${ifw} -p ${proto} --dport ${cfg.dns.port} -j ACCEPT`);
      // the proxy binds all addresses; it must not become an open resolver for other networks
      filter.push(`-A ${input} ! -i ${ifw} -p ${proto} --dport ${cfg.dns.port} -j DROP`);
    }
  }
  if (cfg.egress.enabled) {
    // only connections our redirect chain sent here (REDIRECT counts as DNAT), and none from elsewhere
    filter.push(`-A ${input} -i ${ifw} -p tcp --dport ${cfg.egress.port} -m conntrack --ctstate DNAT -j ACCEPT`);
    filter.push(`-A ${input} ! -i ${ifw} -p tcp --dport ${cfg.egress.port} -j DROP`);
  }
  filter.push(`-A ${input} -i ${ifw} -j DROP`, `-I FORWARD 1 -j ${fwd}`, `-I INPUT 1 -j ${input}`);
  const nat = [`:${post} - [0:0]`, `-A ${post} -s ${formatCidr(cfg.vethCidr)} ! -o ${ifw} -j MASQUERADE`, `-I POSTROUTING 1 -j ${post}`];
  // the egress interceptor's redirects (egress/redirect.ts fills the chain; empty until then)
  if (cfg.egress.enabled) nat.push(`:${egr} - [0:0]`, `-I PREROUTING 1 -j ${egr}`);
  return { filter, nat };
}

/** Node-namespace rules (filter + nat), applied once at start after reaping. */
export function hostRules(cfg: NetConfig): string {
  const { filter, nat } = hostRuleLines(cfg);
  return ["*filter", ...filter, "COMMIT", "*nat", ...nat, "COMMIT", ""].join("\n");
}

/**
 * The complete rule set of a fresh slot namespace: inbound DNAT hostIp → guest, outbound SNAT
 * guest → nsVethIp, DNS redirect to the node's proxy, and the egress chains with `policy`.
 * `replace`: the same rules replacing those of a live slot (its built-in chains flushed first,
 * in the same commit per table): what a node applies to a slot it adopts, idempotently.
 */
export function slotRules(cfg: NetConfig, slot: Slot, policy: EgressPolicy, dnsAllowed: DnsAllowed[] = [], replace = false): string {
  const nat = [
    "*nat",
    // replacing the rules of a live slot (adoption): its built-in chains are emptied in the same commit
    ...(replace ? ["-F PREROUTING", "-F POSTROUTING"] : []),
    `-A PREROUTING -i ${slot.nsVeth} -d ${slot.hostIp}/32 -j DNAT --to-destination ${slot.guestIp}`,
  ];
  if (cfg.dns.enabled) {
    for (const proto of ["udp", "tcp"]) {
      nat.push(`-A PREROUTING -i ${slot.tapName} -p ${proto} --dport 53 -j DNAT --to-destination ${slot.hostVethIp}:${cfg.dns.port}`);
    }
  }
  nat.push(`-A POSTROUTING -o ${slot.nsVeth} -s ${slot.guestIp}/32 -j SNAT --to-source ${slot.nsVethIp}`, "COMMIT");
  const filter = [
    "*filter",
    ...(replace ? ["-F INPUT", "-F FORWARD"] : []),
    `:${CHAIN_EGRESS} - [0:0]`,
    `:${CHAIN_POLICY} - [0:0]`,
    `:${CHAIN_DNS} - [0:0]`,
    `:${CHAIN_DENY} - [0:0]`,
    `-A ${CHAIN_DENY} -p tcp -j REJECT --reject-with tcp-reset`,
    `-A ${CHAIN_DENY} -j REJECT --reject-with icmp-admin-prohibited`,
    `-A INPUT -i ${slot.tapName} -p icmp -j ACCEPT`,
    `-A INPUT -i ${slot.tapName} -j DROP`,
    // A guest may only speak as itself: a forged source would dodge the SNAT and impersonate
    // another slot towards the node (the DNS proxy identifies slots by source address).
    `-A FORWARD -i ${slot.tapName} ! -s ${slot.guestIp}/32 -j DROP`,
    `-A FORWARD -i ${slot.tapName} -o ${slot.nsVeth} -j ${CHAIN_EGRESS}`,
    `-A FORWARD -i ${slot.tapName} -j DROP`,
    `-A FORWARD -i ${slot.nsVeth} -o ${slot.tapName} -m conntrack --ctstate DNAT,ESTABLISHED,RELATED -j ACCEPT`,
    `-A FORWARD -i ${slot.nsVeth} -j DROP`,
    // Replies to connections the node opened to the guest pass whatever the policy says.
    `-A ${CHAIN_EGRESS} -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT`,
  ];
  if (cfg.dns.enabled) {
    for (const proto of ["udp", "tcp"]) {
      filter.push(`-A ${CHAIN_EGRESS} -d ${slot.hostVethIp}/32 -p ${proto} --dport ${cfg.dns.port} -m conntrack --ctstate DNAT -j ACCEPT`);
    }
  }
  filter.push(`-A ${CHAIN_EGRESS} -j ${CHAIN_POLICY}`, `-A ${CHAIN_EGRESS} -j ${DENY}`);
  return [...nat, ...policyChains(cfg, policy, dnsAllowed, filter, false), "COMMIT", ""].join("\n");
}

/**
 * A filter-table script replacing the policy and DNS chains (runtime policy update).
 * Guest-originated packets are checked against the policy on every packet, not only the first of
 * a connection, so a replaced policy also cuts connections that are already open.
 */
export function policyScript(cfg: NetConfig, policy: EgressPolicy, dnsAllowed: DnsAllowed[]): string {
  return [...policyChains(cfg, policy, dnsAllowed, ["*filter"], true), "COMMIT", ""].join("\n");
}

/** A filter-table script replacing only the DNS-learned chain. */
export function dnsScript(dnsAllowed: DnsAllowed[]): string {
  return ["*filter", `:${CHAIN_DNS} - [0:0]`, ...dnsAllowed.map(dnsRule), "COMMIT", ""].join("\n");
}

function policyChains(cfg: NetConfig, policy: EgressPolicy, dnsAllowed: DnsAllowed[], into: string[], declare: boolean): string[] {
  const c = (x: Cidr) => formatCidr(x);
  if (declare) into.push(`:${CHAIN_POLICY} - [0:0]`, `:${CHAIN_DNS} - [0:0]`);
  for (const a of policy.allowCidrs) into.push(`-A ${CHAIN_POLICY} -d ${c(a)} -j ACCEPT`);
  into.push(`-A ${CHAIN_POLICY} -j ${CHAIN_DNS}`);
  for (const d of cfg.alwaysDenied) into.push(`-A ${CHAIN_POLICY} -d ${c(d)} -j ${DENY}`);
  for (const d of policy.denyCidrs) into.push(`-A ${CHAIN_POLICY} -d ${c(d)} -j ${DENY}`);
  const open = policy.allowInternetAccess && cfg.defaultAction === "allow";
  into.push(`-A ${CHAIN_POLICY} -j ${open ? "ACCEPT" : DENY}`);
  for (const e of dnsAllowed) into.push(dnsRule(e));
  return into;
}
