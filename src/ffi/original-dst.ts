/**
 * SO_ORIGINAL_DST (include/uapi/linux/netfilter_ipv4.h, value 80, level SOL_IP 0): the IPv4
 * destination a connection had before an iptables REDIRECT/DNAT in this network namespace sent
 * it to our listener. The node's egress interceptor reads it to know where a guest meant to go.
 * Answer: struct sockaddr_in { u16 family; be16 port; be32 addr; u8 zero[8] } (16 bytes).
 */
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc } from "./libc.ts";

export const SOL_IP = 0;
export const SO_ORIGINAL_DST = 80;
const SOCKADDR_IN_SIZE = 16;
const AF_INET = 2;

/** A failed getsockopt(2). */
export class SockoptError extends AgentEnvError<FfiCodes<"sockopt">> {
  constructor(option: string, fd: number, readonly errno: number) {
    super("sockopt.failed", `getsockopt(${option}) on fd ${fd} failed: errno ${errno}`, { option, fd, errno });
  }
}

/** Decode a struct sockaddr_in. @returns null when its family is not AF_INET. */
export function decodeSockaddrIn(b: Uint8Array): { host: string; port: number } | null {
  const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
  if (v.getUint16(0, true) !== AF_INET) return null;
  return { host: `${b[4]}.${b[5]}.${b[6]}.${b[7]}`, port: v.getUint16(2, false) };
}

/**
 * The original destination of accepted TCP socket `fd`.
 * @throws SockoptError (errno ENOENT 2: the connection was not redirected by netfilter)
 */
export function originalDestination(fd: number): { host: string; port: number } {
  const buf = new Uint8Array(SOCKADDR_IN_SIZE);
  const len = new Uint32Array([SOCKADDR_IN_SIZE]);
  if (libc().getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, buf, len) !== 0) throw new SockoptError("SO_ORIGINAL_DST", fd, errno());
  const d = decodeSockaddrIn(buf);
  if (!d) throw new SockoptError("SO_ORIGINAL_DST", fd, 97); // EAFNOSUPPORT
  return d;
}
