/**
 * Outbound connections the egress interceptor makes for a guest: straight to the destination,
 * or through the sandbox's egress proxy (SOCKS5 with the `socks` package, RFC 1928/1929; HTTP
 * CONNECT, RFC 9110 §9.3.6). Fails closed: a proxy that cannot be reached, refuses the
 * credentials or the destination is an error, never a direct connection. A proxy's host name is
 * resolved here and each address checked with `isDenied` (the node's always-denied ranges the
 * sandbox's allowOut does not open), like any destination of the sandbox.
 */
import { lookup } from "node:dns/promises";
import net from "node:net";
import { SocksClient } from "socks";
import { errorMessage } from "../../util/error.ts";
import { parseIpv4 } from "../ipv4.ts";
import type { EgressProxy } from "./proxy-config.ts";

/** Where to connect: `host` is an IPv4 address or, through a proxy, a name it resolves. */
export interface DialTarget {
  host: string;
  port: number;
}

/** A failed dial, with words for the guest (never a credential). */
export class DialError extends Error {}

function connectDirect(host: string, port: number, timeoutMs: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host, port });
    const timer = setTimeout(() => {
      s.destroy();
      reject(new DialError(`connecting to ${host}:${port} timed out after ${timeoutMs} ms`));
    }, timeoutMs);
    s.once("connect", () => {
      clearTimeout(timer);
      s.removeAllListeners("error");
      resolve(s);
    });
    s.once("error", (e) => {
      clearTimeout(timer);
      reject(new DialError(`connecting to ${host}:${port} failed: ${errorMessage(e)}`));
    });
  });
}

/** The proxy's address to dial: its IPv4 literal, or the first address its name resolves to that `denied` does not hold. */
async function proxyAddress(p: EgressProxy, isDenied: (ip: number) => boolean): Promise<string> {
  const addrs = parseIpv4(p.host) !== null ? [p.host] : (await lookup(p.host, { family: 4, all: true }).catch((e) => {
    throw new DialError(`the egress proxy ${p.host} does not resolve: ${errorMessage(e)}`);
  })).map((a) => a.address);
  const ok = addrs.find((a) => !isDenied(parseIpv4(a)!));
  if (!ok) throw new DialError(`the egress proxy ${p.host} resolves only to denied addresses (${addrs.join(", ")})`);
  return ok;
}

async function connectHttpProxy(addr: string, p: EgressProxy, t: DialTarget, timeoutMs: number): Promise<net.Socket> {
  const s = await connectDirect(addr, p.port, timeoutMs);
  const auth = p.username !== undefined ? `Proxy-Authorization: Basic ${Buffer.from(`${p.username}:${p.password ?? ""}`).toString("base64")}\r\n` : "";
  const authority = t.host.includes(":") ? `[${t.host}]:${t.port}` : `${t.host}:${t.port}`;
  s.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${auth}\r\n`);
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => done(new DialError(`the HTTP proxy did not answer CONNECT within ${timeoutMs} ms`)), timeoutMs);
    const done = (e: Error | null) => {
      clearTimeout(timer);
      s.off("data", onData);
      s.off("error", onError);
      s.off("close", onClose);
      if (e) {
        s.destroy();
        reject(e);
      } else resolve(s);
    };
    const onError = (e: Error) => done(new DialError(`the HTTP proxy connection failed: ${errorMessage(e)}`));
    const onClose = () => done(new DialError("the HTTP proxy closed the connection during CONNECT"));
    const onData = (c: Buffer) => {
      buf = Buffer.concat([buf, c]);
      const end = buf.indexOf("\r\n\r\n");
      if (end < 0) {
        if (buf.length > 16_384) done(new DialError("the HTTP proxy's CONNECT answer is too long"));
        return;
      }
      const status = /^HTTP\/1\.[01] ([0-9]{3})/.exec(buf.subarray(0, end).toString("latin1"));
      if (!status || status[1] !== "200") return done(new DialError(`the HTTP proxy refused CONNECT ${authority}: ${status ? `status ${status[1]}` : "malformed answer"}`));
      const rest = buf.subarray(end + 4);
      done(null);
      if (rest.length) s.unshift(rest);
    };
    s.on("data", onData);
    s.on("error", onError);
    s.on("close", onClose);
  });
}

/**
 * A TCP connection to `t`, through `proxy` when given.
 * @throws DialError saying why (timeouts, refusals, proxy authentication or CONNECT failures)
 */
export async function dial(t: DialTarget, proxy: EgressProxy | null, isDenied: (ip: number) => boolean, timeoutMs: number): Promise<net.Socket> {
  if (!proxy) return connectDirect(t.host, t.port, timeoutMs);
  const addr = await proxyAddress(proxy, isDenied);
  if (proxy.protocol === "http") return connectHttpProxy(addr, proxy, t, timeoutMs);
  try {
    const { socket } = await SocksClient.createConnection({
      command: "connect",
      destination: { host: t.host, port: t.port },
      proxy: { ipaddress: addr, port: proxy.port, type: 5, ...(proxy.username !== undefined ? { userId: proxy.username, password: proxy.password ?? "" } : {}) },
      timeout: timeoutMs,
    });
    return socket;
  } catch (e) {
    // the socks package's messages name the failing step (authentication, connection refused by the proxy)
    throw new DialError(`the SOCKS5 proxy ${proxy.host}:${proxy.port} failed: ${errorMessage(e)}`);
  }
}
