/**
 * The DNS proxy's port already taken: a typed NetError `net.dns_bind` naming the config key, the
 * address and the errno, instead of a raw bind trace; nothing stays bound. Loopback only, plus one
 * NetworkManager start inside a test-made node netns (root) where port 10053 itself is occupied.
 */
import { afterEach, beforeAll, describe, expect, test } from "bun:test";
import dgram from "node:dgram";
import type { AddressInfo } from "node:net";
import { DnsProxy } from "../../src/net/dns-proxy.ts";
import { NetError } from "../../src/net/errors.ts";
import { World } from "./harness.ts";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
}, 60_000);

async function occupyUdp(port = 0): Promise<number> {
  const s = dgram.createSocket("udp4");
  await new Promise<void>((res) => s.bind(port, "127.0.0.1", () => res()));
  cleanups.push(() => new Promise<void>((res) => s.close(() => res())));
  return (s.address() as AddressInfo).port;
}

function proxy(port: number, bindIp?: string): DnsProxy {
  return new DnsProxy({ port, bindIp, upstream: [{ ip: "127.0.0.1", port: 9 }], timeoutMs: 500, maxInflight: 2, onAnswer: async () => {} });
}

async function startError(p: DnsProxy): Promise<NetError> {
  try {
    await p.start();
  } catch (e) {
    return e as NetError;
  }
  await p.stop();
  throw new Error("start() succeeded on a taken port");
}

describe("DNS proxy port in use", () => {
  test("UDP port taken on loopback: binding all addresses fails as net.dns_bind naming the key", async () => {
    const port = await occupyUdp();
    const e = await startError(proxy(port));
    expect(e).toBeInstanceOf(NetError);
    expect(e.code).toBe("net.dns_bind");
    expect(e.details).toEqual({ key: "network.egress.dns_proxy_port", protocol: "udp", address: "0.0.0.0", port, errno: "EADDRINUSE" });
    expect(e.message).toContain(`0.0.0.0:${port}`);
    expect(e.message).toContain("network.egress.dns_proxy_port");
  });

  test("same address and port taken: net.dns_bind with the bind address", async () => {
    const port = await occupyUdp();
    const e = await startError(proxy(port, "127.0.0.1"));
    expect(e.code).toBe("net.dns_bind");
    expect(e.details).toMatchObject({ protocol: "udp", address: "127.0.0.1", port, errno: "EADDRINUSE" });
  });

  test("TCP port taken: net.dns_bind for tcp, and the UDP socket bound first is released", async () => {
    // a UDP port number known free, then its TCP twin taken by a listener of ours
    const probe = dgram.createSocket("udp4");
    await new Promise<void>((res) => probe.bind(0, "127.0.0.1", () => res()));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((res) => probe.close(() => res()));
    const listener = Bun.listen({ hostname: "127.0.0.1", port, socket: { data() {} } });
    cleanups.push(() => listener.stop(true));
    const e = await startError(proxy(port, "127.0.0.1"));
    expect(e.code).toBe("net.dns_bind");
    expect(e.details).toMatchObject({ key: "network.egress.dns_proxy_port", protocol: "tcp", address: "127.0.0.1", port });
    // nothing left bound on UDP: the port can be bound again right away
    expect(await occupyUdp(port)).toBe(port);
  });

  test("a free port still starts and stops", async () => {
    const p = proxy(0, "127.0.0.1");
    await p.start();
    expect(p.port).toBeGreaterThan(0);
    await p.stop();
  });
});

describe("NetworkManager start with the DNS port taken (real netns)", () => {
  // a missing prerequisite fails these tests, it does not skip them
  beforeAll(() => {
    if (process.getuid?.() !== 0) throw new Error("these tests make network namespaces and iptables rules: run them as root");
  });
  let w: World | undefined;
  afterEach(async () => {
    await w?.cleanup();
    w = undefined;
  }, 60_000);

  test("start() fails with net.dns_bind for network.egress.dns_proxy_port 10053, not a raw bind error", async () => {
    w = new World();
    // hold UDP 127.0.0.1:10053 inside the test's node netns (not the host's)
    const holder = Bun.spawn(
      ["nsenter", `--net=/run/netns/${w.nodeNs}`, process.execPath, "-e",
        `const s = require("node:dgram").createSocket("udp4"); s.bind(10053, "127.0.0.1", () => console.log("ready")); setTimeout(() => {}, 60000);`],
      { stdout: "pipe", stderr: "inherit" },
    );
    cleanups.push(async () => {
      holder.kill("SIGKILL");
      await holder.exited;
    });
    const r = holder.stdout.getReader();
    expect(new TextDecoder().decode((await r.read()).value)).toContain("ready");
    r.releaseLock();
    const { agent, start } = await w.agent({ network: { egress: { dns_proxy_port: 10053 } } });
    expect(start.ok).toBe(false);
    expect(start.error).toMatchObject({
      code: "net.dns_bind",
      details: { key: "network.egress.dns_proxy_port", protocol: "udp", address: "0.0.0.0", port: 10053, errno: "EADDRINUSE" },
    });
    expect(start.error!.message).toContain("network.egress.dns_proxy_port");
    agent.proc.kill();
  }, 60_000);
});
