/**
 * The node's egress DNS proxy. Slots redirect the guest's port 53 (UDP, TCP) to it (DNAT in the slot
 * netns), so it sees every query with the slot's namespace veth address as source. It forwards
 * each query to an upstream resolver and, before relaying the answer, hands the A records to
 * `onAnswer`, which opens the slot's firewall for them when the name matches an allowOut
 * domain pattern. The guest therefore never sees an address its firewall does not admit yet.
 *
 * UDP and TCP (RFC 7766: 2-byte length-prefixed messages; a TCP query goes to upstream over TCP,
 * so answers too large for UDP work) are served on the same port number.
 *
 * Bounds: at most `maxInflight` queries (UDP + TCP) wait for upstream, and at most `maxInflight`
 * TCP connections are open; each query waits `timeoutMs`, then the guest gets SERVFAIL. Upstream
 * UDP answers are matched by (upstream address, port, random 16-bit id).
 */
import type { Socket, TCPSocketListener } from "bun";
import dgram from "node:dgram";
import { readFileSync } from "node:fs";
import { logger } from "../observability/log.ts";
import { HDR_SIZE, parseMessage, readName, withId } from "./dns-wire.ts";
import { NetError } from "./errors.ts";

const log = logger("net.dns");

/** Config key that sets the proxy's port (named in bind errors so the operator knows what to change). */
export const DNS_PORT_KEY = "network.egress.dns_proxy_port";

/**
 * A bind/listen failure of the proxy's own port as NetError `net.dns_bind` naming the config key,
 * the address and the errno (EADDRINUSE: another process, or another node, holds the port).
 */
function bindError(e: unknown, protocol: "udp" | "tcp", ip: string, port: number): NetError {
  const errno = (e as { code?: string }).code ?? "unknown";
  const hint = errno === "EADDRINUSE" ? "port in use (another DNS proxy or node on this host?); " : "";
  return new NetError(
    "net.dns_bind",
    `DNS proxy cannot bind ${protocol} ${ip}:${port}: ${errno}: ${hint}set ${DNS_PORT_KEY} to a free port (0 picks one)`,
    { key: DNS_PORT_KEY, protocol, address: ip, port, errno },
    { cause: e },
  );
}

/** Called with the querying address, the question name and the A records before the reply is sent. */
export type DnsAnswerHook = (clientIp: string, qname: string, addrs: { ip: string; ttl: number }[]) => Promise<void>;

/** Settings of a DnsProxy; times in ms. */
export interface DnsProxyOptions {
  port: number;
  /** Address to bind (default all). */
  bindIp?: string;
  upstream: { ip: string; port: number }[];
  timeoutMs: number;
  maxInflight: number;
  onAnswer: DnsAnswerHook;
}

interface Pending {
  clientIp: string;
  clientPort: number;
  clientId: number;
  query: Uint8Array;
  upstream: { ip: string; port: number };
  timer: ReturnType<typeof setTimeout>;
}

/** Nameservers of /etc/resolv.conf (IPv4 only), port 53. */
export function systemResolvers(path = "/etc/resolv.conf"): { ip: string; port: number }[] {
  try {
    return readFileSync(path, "utf8")
      .split("\n")
      .map((l) => /^\s*nameserver\s+([0-9.]+)\s*$/.exec(l)?.[1])
      .filter((ip): ip is string => !!ip)
      .map((ip) => ({ ip, port: 53 }));
  } catch {
    return [];
  }
}

/** A SERVFAIL reply: the query's header and question, flags QR|RD|RA|rcode 2, no records. */
function servfailFor(query: Uint8Array): Uint8Array {
  let end = query.length;
  try {
    end = readName(query, HDR_SIZE).next + 4;
  } catch {
    end = Math.min(query.length, HDR_SIZE);
  }
  const out = Uint8Array.from(query.subarray(0, Math.min(end, query.length)));
  const dv = new DataView(out.buffer);
  dv.setUint16(2, 0x8182);
  dv.setUint16(6, 0);
  dv.setUint16(8, 0);
  dv.setUint16(10, 0);
  return out;
}

/** Per-connection state of a TCP client. */
interface TcpConn {
  buf: Uint8Array;
  out: Uint8Array[];
}

/** Bytes of `msg` prefixed with its 2-byte big-endian length (RFC 1035 §4.2.2). */
function frame(msg: Uint8Array): Uint8Array {
  const out = new Uint8Array(msg.length + 2);
  new DataView(out.buffer).setUint16(0, msg.length);
  out.set(msg, 2);
  return out;
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

/**
 * One query over TCP to `upstream`: connect, send the framed message, read one framed answer.
 * @throws Error on connect failure, early close or after `timeoutMs`.
 */
export async function tcpExchange(upstream: { ip: string; port: number }, msg: Uint8Array, timeoutMs: number): Promise<Uint8Array> {
  let sock: Socket<undefined> | undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await new Promise<Uint8Array>((resolve, reject) => {
      let buf: Uint8Array = new Uint8Array();
      timer = setTimeout(() => reject(new Error(`dns tcp upstream ${upstream.ip}:${upstream.port} timed out`)), timeoutMs);
      Bun.connect({
        hostname: upstream.ip,
        port: upstream.port,
        socket: {
          open(s) {
            sock = s;
            s.write(frame(msg));
          },
          data(_s, d) {
            buf = concat(buf, new Uint8Array(d));
            if (buf.length >= 2) {
              const n = (buf[0]! << 8) | buf[1]!;
              if (buf.length >= n + 2) resolve(buf.slice(2, n + 2));
            }
          },
          close() {
            reject(new Error("dns tcp upstream closed before answering"));
          },
          connectError(_s, e) {
            reject(e);
          },
        },
      }).catch(reject);
    });
  } finally {
    clearTimeout(timer);
    sock?.end();
  }
}

/** UDP + TCP DNS forwarder owned by the NetworkManager. */
export class DnsProxy {
  private server?: dgram.Socket;
  private client?: dgram.Socket;
  private tcp?: TCPSocketListener<TcpConn>;
  private tcpConns = 0;
  private tcpInflight = 0;
  private readonly pending = new Map<string, Pending>();
  private next = 0;

  constructor(private readonly opts: DnsProxyOptions) {}

  /**
   * Bind the UDP server socket, the upstream socket and the TCP listener (same port number).
   * @throws NetError `net.dns_bind` (`details.key` = `network.egress.dns_proxy_port`,
   *   `details.protocol`, `details.address`, `details.port`, `details.errno`, e.g. EADDRINUSE)
   *   when the proxy's port cannot be bound; nothing stays bound then.
   */
  async start(): Promise<void> {
    const ip = this.opts.bindIp ?? "0.0.0.0";
    const server = dgram.createSocket("udp4");
    const client = dgram.createSocket("udp4");
    try {
      await new Promise<void>((res, rej) => {
        server.once("error", (e) => rej(bindError(e, "udp", ip, this.opts.port)));
        try {
          server.bind(this.opts.port, ip, () => res());
        } catch (e) {
          rej(bindError(e, "udp", ip, this.opts.port));
        }
      });
      await new Promise<void>((res, rej) => {
        client.once("error", rej);
        client.bind(0, "0.0.0.0", () => res());
      });
    } catch (e) {
      for (const s of [server, client]) {
        try {
          s.close();
        } catch {
          // never bound
        }
      }
      throw e;
    }
    const boundPort = (server.address() as { port: number }).port;
    try {
      this.tcp = this.listenTcp(boundPort);
    } catch (e) {
      server.close();
      client.close();
      throw bindError(e, "tcp", ip, boundPort);
    }
    server.on("message", (m, r) => this.onQuery(new Uint8Array(m), r.address, r.port));
    client.on("message", (m, r) => void this.onUpstream(new Uint8Array(m), r.address, r.port));
    server.on("error", (e) => log.error({ err: e }, "dns server socket error"));
    client.on("error", (e) => log.error({ err: e }, "dns upstream socket error"));
    this.server = server;
    this.client = client;
  }

  /** Close sockets; pending queries are dropped. */
  async stop(): Promise<void> {
    for (const p of this.pending.values()) clearTimeout(p.timer);
    this.pending.clear();
    this.tcp?.stop(true);
    this.tcp = undefined;
    await Promise.all(
      [this.server, this.client].filter((s): s is dgram.Socket => !!s).map((s) => new Promise<void>((res) => s.close(() => res()))),
    );
    this.server = this.client = undefined;
  }

  /** The UDP port the proxy listens on (the bound one when `port` was 0). */
  get port(): number {
    const a = this.server?.address();
    return a && typeof a === "object" ? a.port : this.opts.port;
  }

  /** Number of queries waiting for upstream (UDP + TCP). */
  get inflight(): number {
    return this.pending.size + this.tcpInflight;
  }

  private listenTcp(port: number): TCPSocketListener<TcpConn> {
    const self = this;
    const flush = (s: Socket<TcpConn>) => {
      while (s.data.out.length > 0) {
        const head = s.data.out[0]!;
        const n = s.write(head);
        if (n < head.length) {
          s.data.out[0] = head.subarray(Math.max(n, 0));
          return;
        }
        s.data.out.shift();
      }
    };
    return Bun.listen<TcpConn>({
      hostname: this.opts.bindIp ?? "0.0.0.0",
      port,
      socket: {
        open(s) {
          if (self.tcpConns >= self.opts.maxInflight) {
            s.end();
            return;
          }
          self.tcpConns++;
          s.data = { buf: new Uint8Array(), out: [] };
          s.timeout(Math.max(1, Math.ceil(self.opts.timeoutMs / 1000) * 2));
        },
        data(s, d) {
          if (!s.data) return;
          s.data.buf = concat(s.data.buf, new Uint8Array(d));
          while (s.data.buf.length >= 2) {
            const n = (s.data.buf[0]! << 8) | s.data.buf[1]!;
            if (s.data.buf.length < n + 2) break;
            const q = s.data.buf.slice(2, n + 2);
            s.data.buf = s.data.buf.slice(n + 2);
            void self.onTcpQuery(q, s.remoteAddress).then((answer) => {
              s.data.out.push(frame(answer));
              flush(s);
            });
          }
        },
        drain(s) {
          if (s.data) flush(s);
        },
        timeout(s) {
          s.end();
        },
        close(s) {
          if (s.data) self.tcpConns--;
        },
      },
    });
  }

  /** Answer one TCP query: upstream over TCP, hook, answer (SERVFAIL on any failure). */
  private async onTcpQuery(msg: Uint8Array, clientIp: string): Promise<Uint8Array> {
    const upstream = this.opts.upstream[this.next++ % Math.max(1, this.opts.upstream.length)];
    if (msg.length < HDR_SIZE || !upstream || this.inflight >= this.opts.maxInflight) return servfailFor(msg);
    this.tcpInflight++;
    try {
      const answer = await tcpExchange(upstream, msg, this.opts.timeoutMs);
      const parsed = parseMessage(answer);
      if (parsed.qname !== null && parsed.answersA.length > 0) {
        await this.opts.onAnswer(clientIp, parsed.qname, parsed.answersA.map(({ ip, ttl }) => ({ ip, ttl })));
      }
      return answer;
    } catch (e) {
      log.warn({ err: e, client: clientIp }, "dns tcp answer not relayed");
      return servfailFor(msg);
    } finally {
      this.tcpInflight--;
    }
  }

  private reply(msg: Uint8Array, ip: string, port: number): void {
    this.server?.send(msg, port, ip);
  }

  private onQuery(msg: Uint8Array, ip: string, port: number): void {
    if (msg.length < HDR_SIZE) return;
    const upstream = this.opts.upstream[this.next++ % Math.max(1, this.opts.upstream.length)];
    if (!upstream || this.inflight >= this.opts.maxInflight) {
      this.reply(servfailFor(msg), ip, port);
      return;
    }
    const clientId = new DataView(msg.buffer, msg.byteOffset).getUint16(0);
    let id = 0;
    let key = "";
    for (let tries = 0; tries < 16; tries++) {
      id = (Math.random() * 65536) | 0;
      key = `${upstream.ip}:${upstream.port}:${id}`;
      if (!this.pending.has(key)) break;
    }
    if (this.pending.has(key)) {
      this.reply(servfailFor(msg), ip, port);
      return;
    }
    const timer = setTimeout(() => {
      if (this.pending.delete(key)) this.reply(servfailFor(msg), ip, port);
    }, this.opts.timeoutMs);
    this.pending.set(key, { clientIp: ip, clientPort: port, clientId, query: msg, upstream, timer });
    this.client?.send(withId(msg, id), upstream.port, upstream.ip);
  }

  private async onUpstream(msg: Uint8Array, ip: string, port: number): Promise<void> {
    if (msg.length < HDR_SIZE) return;
    const id = new DataView(msg.buffer, msg.byteOffset).getUint16(0);
    const key = `${ip}:${port}:${id}`;
    const p = this.pending.get(key);
    if (!p) return;
    this.pending.delete(key);
    clearTimeout(p.timer);
    try {
      const parsed = parseMessage(msg);
      if (parsed.qname !== null && parsed.answersA.length > 0) {
        await this.opts.onAnswer(p.clientIp, parsed.qname, parsed.answersA.map(({ ip, ttl }) => ({ ip, ttl })));
      }
      this.reply(withId(msg, p.clientId), p.clientIp, p.clientPort);
    } catch (e) {
      log.warn({ err: e, client: p.clientIp }, "dns answer not relayed");
      this.reply(servfailFor(p.query), p.clientIp, p.clientPort);
    }
  }
}
