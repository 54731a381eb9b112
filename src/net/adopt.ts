/**
 * Kernel side of adopting the network slots of sandboxes a previous node left running (issue 27):
 * check that a slot is whole (its netns, both veth ends, the tap, the egress chains), read back
 * the DNS-learned addresses its AENV-DNS chain holds (with their names and expiry, from the rule
 * comments: rules.ts), re-apply its whole rule set idempotently (every table replaced in one
 * commit, so traffic never sees a half-applied set; connections keep their conntrack entries),
 * and replace the node-wide rules without a window where they are missing.
 */
import { existsSync } from "node:fs";
import { errorMessage } from "../util/error.ts";
import { mapLimit } from "../util/map-limit.ts";
import type { NetConfig } from "./config.ts";
import { run } from "./exec.ts";
import { listOurLinks, NETNS_DIR, restoreIn } from "./netns.ts";
import { parseEgressPolicy, type EgressPolicy } from "./policy.ts";
import { CHAIN_DENY, CHAIN_DNS, CHAIN_EGRESS, CHAIN_POLICY, hostRuleLines, parseDnsAllowed, slotRules, type DnsAllowed } from "./rules.ts";
import { slotLayout, type Slot } from "./slot.ts";
import type { SlotRow } from "./store.ts";

/** How many slots are inspected, or have their rules re-applied, at once when a node adopts them. */
export const ADOPT_PARALLEL = 8;

/** A slot a starting node keeps for a sandbox that outlives the previous node. */
export interface KeepSlot {
  sandboxId: string;
  /** Its egress policy as the caller's record has it; absent: the one the slot row persisted. */
  policy?: EgressPolicy;
}

/** A kept slot that is whole, with what it is to be run with. */
export interface SlotToAdopt {
  slot: Slot;
  sandboxId: string;
  policy: EgressPolicy;
  dnsAllowed: DnsAllowed[];
}

/** A kept sandbox whose slot cannot be adopted, and why. */
export interface LostSlot {
  sandboxId: string;
  reason: string;
}

/**
 * Which of `keep` can be adopted: each needs an `allocated` row of its own in `rows`, a slot
 * whose name still follows this configuration (`name_prefix`, `max_slots`), a policy that parses
 * and that this configuration can enforce (`enforceable`), and kernel objects that are whole
 * (`inspectSlot`).
 */
export async function planAdoption(cfg: NetConfig, rows: SlotRow[], keep: readonly KeepSlot[], enforceable: (p: EgressPolicy) => void, now: number): Promise<{ adopt: SlotToAdopt[]; lost: LostSlot[] }> {
  if (keep.length === 0) return { adopt: [], lost: [] };
  const byId = new Map(rows.filter((r) => r.state === "allocated" && r.sandboxId).map((r) => [r.sandboxId!, r]));
  const hostLinks = await hostLinkSet(cfg);
  const seen = new Set<string>();
  // in the order of `keep`: refused at once, or a candidate whose kernel objects are to be inspected
  const planned: ({ lost: LostSlot } | { candidate: Omit<SlotToAdopt, "dnsAllowed"> })[] = [];
  for (const k of keep) {
    const row = byId.get(k.sandboxId);
    if (seen.has(k.sandboxId)) continue;
    seen.add(k.sandboxId);
    if (!row) {
      planned.push({ lost: { sandboxId: k.sandboxId, reason: "no allocated slot row names it" } });
      continue;
    }
    if (row.idx >= cfg.maxSlots || slotLayout(cfg, row.idx).netnsName !== row.netns) {
      planned.push({ lost: { sandboxId: k.sandboxId, reason: `slot ${row.idx} (${row.netns}) does not fit this configuration (name_prefix, max_slots)` } });
      continue;
    }
    try {
      const policy = k.policy ?? parseEgressPolicy(row.policy);
      enforceable(policy);
      planned.push({ candidate: { slot: slotLayout(cfg, row.idx), sandboxId: k.sandboxId, policy } });
    } catch (e) {
      planned.push({ lost: { sandboxId: k.sandboxId, reason: `its egress policy: ${errorMessage(e)}` } });
    }
  }
  // each inspection is two commands in the slot's netns: several at once (issue 27: 50 slots)
  const found = await mapLimit(planned, ADOPT_PARALLEL, async (p) => ("candidate" in p ? inspectSlot(cfg, p.candidate.slot, hostLinks, now) : null));
  const adopt: SlotToAdopt[] = [];
  const lost: LostSlot[] = [];
  planned.forEach((p, i) => {
    const f = found[i];
    if ("lost" in p) lost.push(p.lost);
    else if (f && f.whole) adopt.push({ ...p.candidate, dnsAllowed: f.dnsAllowed });
    else if (f && !f.whole) lost.push({ sandboxId: p.candidate.sandboxId, reason: `slot ${p.candidate.slot.idx} is not whole: missing ${f.missing.join(", ")}` });
  });
  return { adopt, lost };
}

/** What `inspectSlot` found: whole (with the DNS-learned addresses it holds), or what is missing. */
export type SlotInspection = { whole: true; dnsAllowed: DnsAllowed[] } | { whole: false; missing: string[] };

/**
 * Check the kernel objects of slot `slot` (one `ip` and one `iptables-save` inside its netns).
 * @param hostLinks our links in the node's namespace (`listOurLinks`), read once for all slots
 * @param now unix ms: DNS-learned rules without our comment (an older node's) expire at now + `dns.minTtlSecs`
 * @throws NetError `net.timeout` when a command hangs
 */
export async function inspectSlot(cfg: NetConfig, slot: Slot, hostLinks: ReadonlySet<string>, now: number): Promise<SlotInspection> {
  const missing: string[] = [];
  if (!existsSync(`${NETNS_DIR}/${slot.netnsName}`)) return { whole: false, missing: [`netns ${slot.netnsName}`] };
  if (!hostLinks.has(slot.hostVeth)) missing.push(`host veth ${slot.hostVeth}`);
  const script = "ip -o link show; echo @@AENV-SPLIT@@; iptables-save -t filter";
  const r = await run(["nsenter", `--net=${slot.netnsPath}`, "sh", "-c", script], { timeoutMs: cfg.commandTimeoutMs, check: false });
  const [links = "", save = ""] = r.stdout.split("@@AENV-SPLIT@@\n");
  for (const name of [slot.nsVeth, slot.tapName]) {
    if (!new RegExp(`^\\d+: ${name.replace(/[.]/g, "\\.")}[:@]`, "m").test(links)) missing.push(`link ${name} in ${slot.netnsName}`);
  }
  for (const chain of [CHAIN_EGRESS, CHAIN_POLICY, CHAIN_DNS, CHAIN_DENY]) {
    if (!new RegExp(`^:${chain} `, "m").test(save)) missing.push(`chain ${chain} in ${slot.netnsName}`);
  }
  if (missing.length > 0) return { whole: false, missing };
  return { whole: true, dnsAllowed: parseDnsAllowed(save, now + cfg.dns.minTtlSecs * 1000) };
}

/** Our links in the node's namespace, as a set (for `inspectSlot`). */
export async function hostLinkSet(cfg: NetConfig): Promise<Set<string>> {
  return new Set(await listOurLinks(cfg.namePrefix, cfg.commandTimeoutMs));
}

/**
 * Apply slot `slot`'s whole rule set again over what its netns holds (NAT with the DNS proxy's
 * current port, the egress chains with `policy` and `dnsAllowed`): each table is replaced in one
 * iptables-restore commit.
 * @throws NetError `net.command_failed`, `net.timeout`
 */
export async function reapplySlot(cfg: NetConfig, slot: Slot, policy: EgressPolicy, dnsAllowed: DnsAllowed[]): Promise<void> {
  await restoreIn(slot.netnsPath, slotRules(cfg, slot, policy, dnsAllowed, true), cfg.commandTimeoutMs);
}

/**
 * Install the node-wide rules (rules.ts `hostRuleLines`) in place of whatever chains with our
 * prefix the node's namespace holds, one commit per table: the jumps into our old chains are
 * deleted, chains no longer wanted are removed, the wanted ones refilled and jumped to once.
 * Unlike removing then adding, no packet of a running slot meets a table without them.
 * @returns the chains of ours that were there before (`<table>/<chain>`)
 * @throws NetError `net.command_failed`, `net.timeout`
 */
export async function replaceHostRules(cfg: NetConfig): Promise<string[]> {
  const prefix = cfg.namePrefix;
  const wanted = hostRuleLines(cfg);
  const found: string[] = [];
  for (const table of ["filter", "nat"] as const) {
    const r = await run(["iptables-save", "-t", table], { timeoutMs: cfg.commandTimeoutMs });
    const lines = r.stdout.split("\n");
    const ours = lines.filter((l) => l.startsWith(`:${prefix}`)).map((l) => l.slice(1).split(" ")[0]!);
    const set = new Set(ours);
    const keep = new Set(wanted[table].filter((l) => l.startsWith(":")).map((l) => l.slice(1).split(" ")[0]!));
    const script = [`*${table}`];
    for (const line of lines) {
      const m = /^-A (\S+) (.*)-j (\S+)\s*$/.exec(line);
      if (m && set.has(m[3]!) && !set.has(m[1]!)) script.push(`-D ${line.slice(3)}`);
    }
    for (const c of ours.filter((c) => !keep.has(c))) script.push(`-F ${c}`, `-X ${c}`);
    script.push(...wanted[table], "COMMIT", "");
    await restoreIn(null, script.join("\n"), cfg.commandTimeoutMs);
    found.push(...ours.map((c) => `${table}/${c}`));
  }
  return found;
}
