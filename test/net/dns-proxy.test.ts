/** DnsProxy on loopback with a real UDP upstream the test runs (no root needed). */
import { afterEach, expect, test } from "bun:test";
import dgram from "node:dgram";
import type { AddressInfo } from "node:net";
import { DnsProxy, tcpExchange } from "../../src/net/dns-proxy.ts";
import { buildQuery, buildResponse, parseMessage } from "../../src/net/dns-wire.ts";
import { waitFor } from "../helpers/wait.ts";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function udp(onMessage?: (sock: dgram.Socket, m: Uint8Array, r: dgram.RemoteInfo) => void): Promise<{ sock: dgram.Socket; port: number }> {
  const sock = dgram.createSocket("udp4");
  if (onMessage) sock.on("message", (m, r) => onMessage(sock, new Uint8Array(m), r));
  await new Promise<void>((res) => sock.bind(0, "127.0.0.1", () => res()));
  cleanups.push(() => new Promise<void>((res) => sock.close(() => res())));
  return { sock, port: (sock.address() as AddressInfo).port };
}

async function freePort(): Promise<number> {
  const s = dgram.createSocket("udp4");
  await new Promise<void>((res) => s.bind(0, "127.0.0.1", () => res()));
  const p = (s.address() as AddressInfo).port;
  await new Promise<void>((res) => s.close(() => res()));
  return p;
}

/** Send `q` from a fresh client socket; resolve with the first reply, or null after `ms`. */
async function ask(port: number, q: Uint8Array, ms: number): Promise<Uint8Array | null> {
  const c = await udp();
  return await new Promise((res) => {
    const t = setTimeout(() => res(null), ms);
    c.sock.on("message", (m) => {
      clearTimeout(t);
      res(new Uint8Array(m));
    });
    c.sock.send(q, port, "127.0.0.1");
  });
}

test("answers are relayed with the client's id after the hook saw the A records", async () => {
  const upstream = await udp((sock, m, r) => sock.send(buildResponse(m, [{ ip: "192.0.2.7", ttl: 30 }]), r.port, r.address));
  const seen: string[] = [];
  const port = await freePort();
  const proxy = new DnsProxy({
    port,
    bindIp: "127.0.0.1",
    upstream: [{ ip: "127.0.0.1", port: upstream.port }],
    timeoutMs: 1000,
    maxInflight: 4,
    onAnswer: async (client, qname, addrs) => {
      await Bun.sleep(20);
      seen.push(`${client} ${qname} ${addrs.map((a) => `${a.ip}/${a.ttl}`).join(",")}`);
    },
  });
  await proxy.start();
  cleanups.push(() => proxy.stop());
  expect(proxy.port).toBe(port);
  const reply = await ask(port, buildQuery(0xbeef, "api.example.com"), 2000);
  expect(reply).not.toBeNull();
  const p = parseMessage(reply!);
  expect(p.id).toBe(0xbeef);
  expect(p.answersA).toEqual([{ name: "api.example.com", ip: "192.0.2.7", ttl: 30 }]);
  expect(seen).toEqual(["127.0.0.1 api.example.com 192.0.2.7/30"]);
  expect(proxy.inflight).toBe(0);
});

test("a silent upstream yields SERVFAIL after the timeout; beyond maxInflight at once", async () => {
  const upstream = await udp(() => {}); // never answers
  const port = await freePort();
  const proxy = new DnsProxy({
    port,
    bindIp: "127.0.0.1",
    upstream: [{ ip: "127.0.0.1", port: upstream.port }],
    timeoutMs: 1500,
    maxInflight: 1,
    onAnswer: async () => {},
  });
  await proxy.start();
  cleanups.push(() => proxy.stop());
  const t0 = performance.now();
  const order: string[] = [];
  const first = ask(port, buildQuery(1, "a.example.com"), 4000).then((r) => (order.push("first (timed out upstream)"), r));
  await waitFor("the first query to wait for upstream", () => proxy.inflight === 1);
  const second = await ask(port, buildQuery(2, "b.example.com"), 2000);
  order.push("second (over the bound)");
  expect(order).toEqual(["second (over the bound)"]); // refused at once, while the first still waits for its timeout
  expect(parseMessage(second!)).toMatchObject({ id: 2, qname: "b.example.com", answersA: [] });
  expect(parseMessage(second!).flags & 0xf).toBe(2);
  const r1 = await first;
  expect(performance.now() - t0).toBeGreaterThanOrEqual(1490);
  expect(parseMessage(r1!).flags & 0xf).toBe(2);
  expect(proxy.inflight).toBe(0);
});

test("a hook failure turns the answer into SERVFAIL (the guest never sees an address its firewall lacks)", async () => {
  const upstream = await udp((sock, m, r) => sock.send(buildResponse(m, [{ ip: "192.0.2.8", ttl: 30 }]), r.port, r.address));
  const port = await freePort();
  const proxy = new DnsProxy({
    port,
    bindIp: "127.0.0.1",
    upstream: [{ ip: "127.0.0.1", port: upstream.port }],
    timeoutMs: 1000,
    maxInflight: 4,
    onAnswer: async () => {
      throw new Error("iptables failed");
    },
  });
  await proxy.start();
  cleanups.push(() => proxy.stop());
  const reply = parseMessage((await ask(port, buildQuery(9, "x.example.com"), 2000))!);
  expect(reply.flags & 0xf).toBe(2);
  expect(reply.answersA).toEqual([]);
});

test("port 0 binds a free port and reports it; a taken port fails start() without leaking sockets", async () => {
  const upstream = await udp(() => {});
  const opts = { bindIp: "127.0.0.1", upstream: [{ ip: "127.0.0.1", port: upstream.port }], timeoutMs: 100, maxInflight: 1, onAnswer: async () => {} };
  const a = new DnsProxy({ ...opts, port: 0 });
  await a.start();
  cleanups.push(() => a.stop());
  expect(a.port).toBeGreaterThan(0);
  const b = new DnsProxy({ ...opts, port: a.port });
  await expect(b.start()).rejects.toThrow(/EADDRINUSE|in use/i);
  await b.stop();
});

test("TCP queries go upstream over TCP (large answers survive) and pass the hook", async () => {
  // upstream TCP server: 40 A records (> 512 bytes, too big for classic UDP)
  const many = Array.from({ length: 40 }, (_, i) => ({ ip: `192.0.2.${i + 1}`, ttl: 60 }));
  let buf = new Uint8Array();
  const up = Bun.listen({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      data(s, d) {
        buf = Uint8Array.from([...buf, ...new Uint8Array(d)]);
        const n = (buf[0]! << 8) | buf[1]!;
        if (buf.length < n + 2) return;
        const ans = buildResponse(buf.slice(2, n + 2), many);
        buf = new Uint8Array();
        s.write(Uint8Array.from([ans.length >> 8, ans.length & 255, ...ans]));
      },
    },
  });
  cleanups.push(() => up.stop(true));
  const seen: number[] = [];
  const proxy = new DnsProxy({
    port: 0,
    bindIp: "127.0.0.1",
    upstream: [{ ip: "127.0.0.1", port: up.port }],
    timeoutMs: 1000,
    maxInflight: 4,
    onAnswer: async (_c, _q, addrs) => void seen.push(addrs.length),
  });
  await proxy.start();
  cleanups.push(() => proxy.stop());
  const answer = parseMessage(await tcpExchange({ ip: "127.0.0.1", port: proxy.port }, buildQuery(0x4321, "big.example.com"), 2000));
  expect(answer.id).toBe(0x4321);
  expect(answer.answersA.length).toBe(40);
  expect(answer.answersA[39]!.ip).toBe("192.0.2.40");
  expect(seen).toEqual([40]);
  expect(proxy.inflight).toBe(0);
  // a dead upstream: SERVFAIL over TCP too
  up.stop(true);
  const fail = parseMessage(await tcpExchange({ ip: "127.0.0.1", port: proxy.port }, buildQuery(5, "big.example.com"), 3000));
  expect(fail.flags & 0xf).toBe(2);
});
