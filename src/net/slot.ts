/**
 * The address bundle of one slot, derived only from its index and the configured ranges, so a
 * restarted node recomputes the same bundle from the index it persisted.
 *
 * Layout of slot i (defaults in brackets):
 *   netns           `<prefix><i>`                  at /run/netns/<prefix><i>
 *   host veth       `<prefix><i>`  veth_cidr.base + 2i     /31   [10.12.0.0/31: .0]
 *   netns veth      `veth0`        veth_cidr.base + 2i + 1 /31   [.1]
 *   host address    host_interaction_cidr.base + 1 + i  /32, routed via the netns veth end and
 *                   DNATed inside the netns to the guest; the node connects here  [10.11.0.1]
 *   tap             `tap0` 169.254.0.22/30, MAC TAP_MAC, in the netns; guest 169.254.0.21 (same in every slot)
 */
import type { NetSpec } from "../vmm/types.ts";
import type { NetConfig } from "./config.ts";
import { formatIpv4 } from "./ipv4.ts";
import type { EgressPolicy } from "./policy.ts";

/** Name of the tap inside every slot's netns. */
export const TAP_NAME = "tap0";
/** Name of the namespace end of the veth pair. */
export const NS_VETH_NAME = "veth0";
/** Guest address on the tap link (fixed, see TAP_LINK). */
export const GUEST_IP = "169.254.0.21";
/** Netns address on the tap link: the guest's gateway and DNS server. */
export const GATEWAY_IP = "169.254.0.22";
/** Prefix length of the tap link. */
export const TAP_PREFIX_LEN = 30;
/**
 * MAC of the tap (the guest's gateway), the same in every slot: a guest restored from a snapshot
 * into any slot still has the gateway's MAC in its ARP cache and reaches it at once.
 */
export const TAP_MAC = "02:ae:ff:ff:ff:fe";

/** Plain data describing one slot; JSON-able. */
export interface Slot {
  idx: number;
  netnsName: string;
  /** e.g. /run/netns/aenv-3: what the VMM is started in (`ip netns exec`, setns). */
  netnsPath: string;
  hostVeth: string;
  nsVeth: string;
  /** Host end of the veth /31. */
  hostVethIp: string;
  /** Namespace end of the veth /31: source of all traffic leaving the slot (SNAT). */
  nsVethIp: string;
  /** The node reaches guest ports at hostIp:port. */
  hostIp: string;
  tapName: string;
  guestIp: string;
  gatewayIp: string;
  prefixLen: number;
  /** Guest MAC, locally administered, derived from the index: 02:ae:<idx as 4 bytes>. */
  mac: string;
  /** Resolver the guest should use (the gateway; port 53 is redirected to the node's DNS proxy). */
  dnsIp: string;
}

/** A slot handed to a sandbox. */
export interface AllocatedSlot extends Slot {
  sandboxId: string;
  policy: EgressPolicy;
}

/** Compute the bundle of slot `idx` (0 ≤ idx < cfg.maxSlots). */
export function slotLayout(cfg: NetConfig, idx: number): Slot {
  if (!Number.isInteger(idx) || idx < 0 || idx >= cfg.maxSlots) throw new RangeError(`slot index ${idx} out of 0..${cfg.maxSlots - 1}`);
  const name = `${cfg.namePrefix}${idx}`;
  const vethBase = cfg.vethCidr.base + 2 * idx;
  const hex = idx.toString(16).padStart(8, "0");
  return {
    idx,
    netnsName: name,
    netnsPath: `/run/netns/${name}`,
    hostVeth: name,
    nsVeth: NS_VETH_NAME,
    hostVethIp: formatIpv4(vethBase >>> 0),
    nsVethIp: formatIpv4((vethBase + 1) >>> 0),
    hostIp: formatIpv4((cfg.hostInteractionCidr.base + 1 + idx) >>> 0),
    tapName: TAP_NAME,
    guestIp: GUEST_IP,
    gatewayIp: GATEWAY_IP,
    prefixLen: TAP_PREFIX_LEN,
    mac: `02:ae:${hex.match(/../g)!.join(":")}`,
    dnsIp: GATEWAY_IP,
  };
}

/** Where the node (and its proxy) connects to reach `port` on the slot's guest. */
export function guestAddress(slot: Slot, port: number): { host: string; port: number } {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RangeError(`port ${port} out of 1..65535`);
  return { host: slot.hostIp, port };
}

/** The VMM's view of a slot (`NetSpec` of src/vmm/types.ts). */
export function netSpec(slot: Slot): NetSpec {
  return {
    netnsPath: slot.netnsPath,
    tapName: slot.tapName,
    mac: slot.mac,
    guestIp: slot.guestIp,
    gatewayIp: slot.gatewayIp,
    prefixLen: slot.prefixLen,
  };
}
