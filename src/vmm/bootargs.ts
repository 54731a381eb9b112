/**
 * Kernel command-line pieces every driver adds (QEMU and Firecracker alike), for the guest
 * init on the tools drive (src/tools/init.sh) and the kernel's IP autoconfiguration (CONFIG_IP_PNP,
 * Documentation/admin-guide/nfs/nfsroot.rst: ip=<client>:<server>:<gw>:<netmask>:<host>:<dev>:<autoconf>).
 */
import type { NetSpec } from "./types.ts";
import { VmmError } from "./errors.ts";

const IPV4 = /^(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}$/;

/** Dotted netmask of a prefix length 0..32, e.g. 30 -> "255.255.255.252". */
export function prefixToNetmask(prefixLen: number): string {
  if (!Number.isInteger(prefixLen) || prefixLen < 0 || prefixLen > 32) {
    throw new VmmError("vmm.bad_spec", `prefix length ${prefixLen} is not 0..32`, { prefixLen });
  }
  const n = prefixLen === 0 ? 0 : (0xffffffff << (32 - prefixLen)) >>> 0;
  return [24, 16, 8, 0].map((s) => (n >>> s) & 255).join(".");
}

/**
 * `ip=` argument configuring eth0 statically before init runs, e.g.
 * `ip=169.254.0.21::169.254.0.22:255.255.255.252::eth0:off`. @throws VmmError `vmm.bad_spec`.
 */
export function kernelIpArg(net: Pick<NetSpec, "guestIp" | "gatewayIp" | "prefixLen">): string {
  for (const [k, v] of [["guestIp", net.guestIp], ["gatewayIp", net.gatewayIp]] as const) {
    if (!IPV4.test(v)) throw new VmmError("vmm.bad_spec", `${k} ${JSON.stringify(v)} is not an IPv4 address`, { [k]: v });
  }
  return `ip=${net.guestIp}::${net.gatewayIp}:${prefixToNetmask(net.prefixLen)}::eth0:off`;
}

/** `aenv.clock=<unix ms>`: the guest init sets its wall clock from it. */
export function kernelClockArg(nowMs = Date.now()): string {
  return `aenv.clock=${Math.floor(nowMs)}`;
}
