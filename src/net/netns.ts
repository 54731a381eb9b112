/**
 * Kernel-side life cycle of one slot and of the node-wide rules, done with `ip` batches and
 * `iptables-restore --noflush` scripts (see exec.ts, rules.ts). Every function here is
 * idempotent or rolls back: a failed build leaves no netns or veth behind.
 */
import { existsSync, readdirSync } from "node:fs";
import { logger } from "../observability/log.ts";
import type { NetConfig } from "./config.ts";
import { NetError } from "./errors.ts";
import { run } from "./exec.ts";
import type { EgressPolicy } from "./policy.ts";
import { dnsScript, policyScript, slotRules, type DnsAllowed } from "./rules.ts";
import { type Slot, TAP_MAC, TAP_PREFIX_LEN } from "./slot.ts";
import { errorMessage } from "../util/error.ts";

const log = logger("net");
/** Directory where `ip netns add` pins named namespaces. */
export const NETNS_DIR = "/run/netns";

/** Run an iptables-restore script inside a slot namespace (`nsenter --net=<path>`), or in ours when `netnsPath` is null. */
export async function restoreIn(netnsPath: string | null, script: string, timeoutMs: number): Promise<void> {
  const cmd = ["iptables-restore", "--noflush", "--wait"];
  await run(netnsPath ? ["nsenter", `--net=${netnsPath}`, ...cmd] : cmd, { stdin: script, timeoutMs });
}

/**
 * Create the netns, veth pair, tap, routes, sysctls and rules of `slot`, applying `policy`.
 * On any failure the partial slot is deleted before the error is rethrown.
 * @throws NetError `net.setup_failed` with the slot index and the failing command's error as cause.
 */
export async function buildSlot(cfg: NetConfig, slot: Slot, policy: EgressPolicy): Promise<void> {
  const t = cfg.commandTimeoutMs;
  try {
    // Node side: netns, veth pair (peer moved into the netns), host address, route to the slot.
    await run(["ip", "-batch", "-"], {
      timeoutMs: t,
      stdin: [
        `netns add ${slot.netnsName}`,
        `link add ${slot.hostVeth} type veth peer name ${slot.nsVeth} netns ${slot.netnsName}`,
        `addr add ${slot.hostVethIp}/31 dev ${slot.hostVeth}`,
        `link set ${slot.hostVeth} up`,
        `route add ${slot.hostIp}/32 via ${slot.nsVethIp} dev ${slot.hostVeth}`,
        "",
      ].join("\n"),
    });
    // Namespace side in one process: links, tap, default route, sysctls, then the rules on stdin.
    await run(["nsenter", `--net=${slot.netnsPath}`, "sh", "-c", `set -e\n${nsLinkScript(slot, true)}\nexec iptables-restore --noflush --wait`], {
      timeoutMs: t,
      stdin: slotRules(cfg, slot, policy),
    });
  } catch (e) {
    await destroySlot(cfg, slot).catch((d) => log.error({ err: d, idx: slot.idx }, "rollback of a half-built slot failed"));
    throw new NetError("net.setup_failed", `building slot ${slot.idx} (${slot.netnsName}) failed: ${errorMessage(e)}`, { idx: slot.idx, netns: slot.netnsName }, { cause: e });
  }
}

/** Shell text run inside the slot netns: (re)create the tap; with `full`, also lo, veth, route, sysctls. */
function nsLinkScript(slot: Slot, full: boolean): string {
  const tap = [
    `tuntap add dev ${slot.tapName} mode tap`,
    `link set ${slot.tapName} address ${TAP_MAC}`,
    `addr add ${slot.gatewayIp}/${TAP_PREFIX_LEN} dev ${slot.tapName}`,
    `link set ${slot.tapName} up`,
  ];
  const lines = full
    ? ["link set lo up", `addr add ${slot.nsVethIp}/31 dev ${slot.nsVeth}`, `link set ${slot.nsVeth} up`, ...tap, `route add default via ${slot.hostVethIp} dev ${slot.nsVeth}`]
    : tap;
  const sysctl = full ? "\necho 1 > /proc/sys/net/ipv4/ip_forward\necho 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6" : "";
  return `ip -batch - <<'EOF'\n${lines.join("\n")}\nEOF${sysctl}`;
}

/** True when a link named `name` exists in the node's namespace. */
export async function linkExists(name: string, timeoutMs: number): Promise<boolean> {
  const r = await run(["ip", "-o", "link", "show", "dev", name], { timeoutMs, check: false });
  return r.rc === 0;
}

/**
 * Delete the slot's host veth (which takes the netns end with it) and its netns. Missing parts are
 * not an error, so this also finishes a half-built or half-deleted slot.
 * @throws NetError `net.teardown_failed` when the netns or the veth still exists afterwards.
 */
export async function destroySlot(cfg: NetConfig, slot: Pick<Slot, "idx" | "netnsName" | "hostVeth">): Promise<void> {
  await destroyNames(cfg, slot.netnsName, slot.hostVeth);
}

async function destroyNames(cfg: NetConfig, netns: string | null, link: string | null): Promise<void> {
  await destroyMany(cfg, netns ? [netns] : [], link ? [link] : []);
}

/** Delete many namespaces and links in one `ip -force -batch` (missing ones are skipped). */
async function destroyMany(cfg: NetConfig, netns: string[], links: string[]): Promise<void> {
  if (netns.length === 0 && links.length === 0) return;
  const t = cfg.commandTimeoutMs;
  // Links go first: deleting only the netns frees its veth asynchronously, later.
  const lines = [...links.map((l) => `link del ${l}`), ...netns.map((n) => `netns del ${n}`)];
  const r = await run(["ip", "-force", "-batch", "-"], { timeoutMs: t, check: false, stdin: lines.join("\n") + "\n" });
  if (r.rc === 0) return;
  const nsLeft = netns.filter((n) => existsSync(`${NETNS_DIR}/${n}`));
  const linkLeft: string[] = [];
  for (const l of links) if (await linkExists(l, t)) linkLeft.push(l);
  if (nsLeft.length > 0 || linkLeft.length > 0) {
    throw new NetError("net.teardown_failed", `could not delete netns [${nsLeft.join(" ")}] links [${linkLeft.join(" ")}]: ${r.stderr.trim()}`, {
      netns: nsLeft,
      link: linkLeft,
      stderr: r.stderr.trim(),
    });
  }
}

/** Replace the policy (and DNS-learned) chains of a live slot in one atomic commit. */
export async function applyPolicy(cfg: NetConfig, slot: Slot, policy: EgressPolicy, dnsAllowed: DnsAllowed[]): Promise<void> {
  await restoreIn(slot.netnsPath, policyScript(cfg, policy, dnsAllowed), cfg.commandTimeoutMs);
}

/** Replace only the DNS-learned allow chain of a live slot. */
export async function applyDnsAllowed(cfg: NetConfig, slot: Slot, dnsAllowed: DnsAllowed[]): Promise<void> {
  await restoreIn(slot.netnsPath, dnsScript(dnsAllowed), cfg.commandTimeoutMs);
}

/**
 * Make a released slot fit for the next sandbox: a fresh tap (no state from the last VM) and
 * the given policy (the pool policy: the default one, so most allocations need no kernel call).
 */
export async function resetSlot(cfg: NetConfig, slot: Slot, policy: EgressPolicy): Promise<void> {
  const script = `ip link del ${slot.tapName} 2>/dev/null || true\nset -e\n${nsLinkScript(slot, false)}\nexec iptables-restore --noflush --wait`;
  await run(["nsenter", `--net=${slot.netnsPath}`, "sh", "-c", script], {
    timeoutMs: cfg.commandTimeoutMs,
    stdin: policyScript(cfg, policy, []),
  });
}

/** What start-up reaping found and removed. */
export interface ReapReport {
  netns: string[];
  links: string[];
  chains: string[];
}

/** Names of our namespaces (`<prefix><digits>`) pinned in /run/netns. */
export function listOurNetns(prefix: string): string[] {
  if (!existsSync(NETNS_DIR)) return [];
  const re = new RegExp(`^${prefix}[0-9]+$`);
  return readdirSync(NETNS_DIR).filter((n) => re.test(n)).sort();
}

/** Names of our links (`<prefix><digits>`) in the node's namespace. */
export async function listOurLinks(prefix: string, timeoutMs: number): Promise<string[]> {
  const r = await run(["ip", "-o", "link", "show"], { timeoutMs });
  const re = new RegExp(`^${prefix}[0-9]+$`);
  const out: string[] = [];
  for (const line of r.stdout.split("\n")) {
    const m = /^\d+:\s+([^:@\s]+)/.exec(line);
    if (m && re.test(m[1]!)) out.push(m[1]!);
  }
  return out.sort();
}

/**
 * Remove our chains from the node's namespace: the jumps to them from built-in chains, then the
 * chains. Only chains whose name starts with `prefix` are touched.
 */
export async function removeHostRules(prefix: string, timeoutMs: number): Promise<string[]> {
  const removed: string[] = [];
  for (const table of ["filter", "nat"]) {
    const r = await run(["iptables-save", "-t", table], { timeoutMs });
    const ours: string[] = [];
    const jumps: string[] = [];
    for (const line of r.stdout.split("\n")) {
      if (line.startsWith(`:${prefix}`)) ours.push(line.slice(1).split(" ")[0]!);
    }
    if (ours.length === 0) continue;
    const set = new Set(ours);
    for (const line of r.stdout.split("\n")) {
      const m = /^-A (\S+) (.*)-j (\S+)\s*$/.exec(line);
      if (m && set.has(m[3]!) && !set.has(m[1]!)) jumps.push(`-D ${line.slice(3)}`);
    }
    const script = [`*${table}`, ...jumps, ...ours.map((c) => `-F ${c}`), ...ours.map((c) => `-X ${c}`), "COMMIT", ""].join("\n");
    await restoreIn(null, script, timeoutMs);
    removed.push(...ours.map((c) => `${table}/${c}`));
  }
  return removed;
}

/**
 * Delete every namespace and host veth carrying our prefix but those named in `keep` (the slots
 * a starting node adopts: each slot's netns and host veth share its name).
 * @returns what was deleted
 */
export async function reapSlots(cfg: NetConfig, keep: ReadonlySet<string>): Promise<{ netns: string[]; links: string[] }> {
  const netns = listOurNetns(cfg.namePrefix).filter((n) => !keep.has(n));
  const links = (await listOurLinks(cfg.namePrefix, cfg.commandTimeoutMs)).filter((l) => !keep.has(l));
  await destroyMany(cfg, netns, links);
  return { netns, links };
}

/** Enable IPv4 forwarding in the node's namespace when `enableIpForward` is configured. */
export async function enableForwarding(cfg: NetConfig): Promise<void> {
  if (cfg.enableIpForward) {
    await run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"], { timeoutMs: cfg.commandTimeoutMs });
  }
}

/** Remove the node-wide chains (shutdown). */
export async function teardownHost(cfg: NetConfig): Promise<void> {
  await removeHostRules(cfg.namePrefix, cfg.commandTimeoutMs);
}
