/**
 * The node-namespace nat chain `<prefix>egr` (jumped to first from PREROUTING, see rules.ts
 * `hostRules`) that sends guest TCP to the egress interceptor: for a slot with rules, its
 * intercepted ports (443 + `intercept_ports`); for a slot with an egress proxy, every port. Only
 * connections to addresses outside the node (`addrtype ! LOCAL`: not the DNS proxy) are taken, and
 * only after the slot's own policy chains admitted them. Rewritten as a whole (one atomic
 * iptables-restore commit) whenever the set of such slots changes; reaped with the node's other
 * chains by prefix.
 */

/** What the chain needs of one slot. */
export interface RedirectedSlot {
  hostVeth: string;
  /** Every TCP port (an egress proxy), or only `ports`. */
  allPorts: boolean;
  ports: readonly number[];
}

/** Name of the chain for a node prefix. */
export function egressChain(prefix: string): string {
  return `${prefix}egr`;
}

/** The nat-table script that makes `<prefix>egr` send `slots`' guest TCP to `port`. */
export function redirectScript(prefix: string, port: number, slots: readonly RedirectedSlot[]): string {
  const chain = egressChain(prefix);
  const lines = ["*nat", `:${chain} - [0:0]`];
  for (const s of [...slots].sort((a, b) => a.hostVeth.localeCompare(b.hostVeth))) {
    const match = `-A ${chain} -i ${s.hostVeth} -p tcp -m addrtype ! --dst-type LOCAL`;
    if (s.allPorts) lines.push(`${match} -j REDIRECT --to-ports ${port}`);
    else if (s.ports.length) lines.push(`${match} -m multiport --dports ${[...s.ports].sort((a, b) => a - b).join(",")} -j REDIRECT --to-ports ${port}`);
  }
  lines.push("COMMIT", "");
  return lines.join("\n");
}
