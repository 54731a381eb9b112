/**
 * A throwaway network namespace holding only a slot-shaped tap (`tap0`, 169.254.0.22/30, MAC
 * TAP_MAC): for a VM that must see exactly the network a sandbox slot gives it (a template booted
 * once to be snapshotted) without the node's slot machinery. The host reaches the guest only
 * from inside the namespace (nsenter).
 */
import { existsSync, readdirSync } from "node:fs";
import { run } from "./exec.ts";
import { GATEWAY_IP, GUEST_IP, TAP_MAC, TAP_NAME, TAP_PREFIX_LEN } from "./slot.ts";
import type { NetSpec } from "../vmm/types.ts";
import { processAlive } from "../ffi/proc.ts";

const NETNS_DIR = "/run/netns";

/** A namespace made by `makeTapNamespace`; `destroy()` removes it (idempotent). */
export interface TapNamespace {
  name: string;
  netnsPath: string;
  /** The VMM view, with `mac` as the guest MAC. */
  spec(mac: string): NetSpec;
  destroy(): Promise<void>;
}

/**
 * Create netns `name` with lo up and the slot tap.
 * @throws NetError `net.command_failed` / `net.timeout` (the half-made namespace is removed)
 */
export async function makeTapNamespace(name: string, timeoutMs: number): Promise<TapNamespace> {
  const netnsPath = `${NETNS_DIR}/${name}`;
  const destroy = async () => {
    await run(["ip", "netns", "del", name], { timeoutMs, check: false });
  };
  try {
    await run(["ip", "netns", "add", name], { timeoutMs });
    const script = ["link set lo up", `tuntap add dev ${TAP_NAME} mode tap`, `link set ${TAP_NAME} address ${TAP_MAC}`, `addr add ${GATEWAY_IP}/${TAP_PREFIX_LEN} dev ${TAP_NAME}`, `link set ${TAP_NAME} up`];
    await run(["ip", "-n", name, "-batch", "-"], { timeoutMs, stdin: script.join("\n") + "\n" });
  } catch (e) {
    await destroy();
    throw e;
  }
  return {
    name,
    netnsPath,
    spec: (mac) => ({ netnsPath, tapName: TAP_NAME, mac, guestIp: GUEST_IP, gatewayIp: GATEWAY_IP, prefixLen: TAP_PREFIX_LEN }),
    destroy,
  };
}

/**
 * Delete namespaces named `<prefix><pid>` whose process `pid` is gone (left by a crash).
 * @returns the names removed
 */
export async function reapTapNamespaces(prefix: string, timeoutMs: number): Promise<string[]> {
  if (!existsSync(NETNS_DIR)) return [];
  const out: string[] = [];
  for (const n of readdirSync(NETNS_DIR)) {
    if (!n.startsWith(prefix)) continue;
    const pid = Number(n.slice(prefix.length));
    if (!Number.isInteger(pid) || pid <= 0) continue;
    if (processAlive(pid)) continue;
    await run(["ip", "netns", "del", n], { timeoutMs, check: false });
    out.push(n);
  }
  return out;
}
