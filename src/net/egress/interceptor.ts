/**
 * The node's egress interceptor: one TCP listener that the node's `<prefix>egr` nat chain
 * REDIRECTs guest connections to (only those of sandboxes with rules or an egress proxy, see
 * redirect.ts). For each connection it reads where the guest meant to go (SO_ORIGINAL_DST) and
 * which sandbox it is (the slot's veth address), then:
 * - a sandbox with rules, on an intercepted port (443 + `[network.egress] intercept_ports`): the
 *   TLS ClientHello's server name picks the rule (rules.ts). With one, TLS is terminated with a
 *   leaf of the node CA (which the guest trusts), each HTTP/1.1 request gets the rule's headers
 *   with `${e2b.secrets.NAME}` resolved now, and goes to the original address over TLS verified
 *   against the host's roots + `upstream_ca_path` for that server name. Without one the bytes
 *   pass untouched;
 * - anything else: passed through untouched, through the sandbox's egress proxy when it has one.
 * The slot's allow/deny chains have already admitted the destination (rules grant nothing).
 * A request whose secret does not exist, or whose upstream fails verification, is answered 502
 * with `x-agentenv-egress-error` and never sent. No value of a secret is logged.
 */
import net from "node:net";
import { Duplex } from "node:stream";
import tls from "node:tls";
import type { Logger } from "pino";
import { originalDestination } from "../../ffi/original-dst.ts";
import { logger } from "../../observability/log.ts";
import { errorMessage } from "../../util/error.ts";
import type { EgressCa } from "./ca.ts";
import { parseClientHello } from "./client-hello.ts";
import { dial, type DialTarget } from "./dial.ts";
import { RequestReader, serializeHead } from "./http1.ts";
import type { EgressProxy } from "./proxy-config.ts";
import { matchRule, type HostRule } from "./rules.ts";

/** What the interceptor needs to know of the sandbox behind a connection. */
export interface SlotEgress {
  sandboxId: string;
  rules: readonly HostRule[];
  proxy: EgressProxy | null;
  /** Whether the sandbox may not reach an address (always-denied, not allowOut): for the proxy's address. */
  isDenied: (ip: number) => boolean;
}

/** Resolves a secret's current value by name (null: none has that name). */
export type ResolveSecret = (name: string) => Promise<string | null>;

export interface InterceptorOptions {
  /** Listen port (0: any free one; `port` tells which after start). */
  port: number;
  /** Ports whose TLS is looked at for rules (443 and the configured extra ones). */
  interceptPorts: ReadonlySet<number>;
  /** Wait for a ClientHello before passing a connection through untouched, ms. */
  helloTimeoutMs: number;
  /** Bound on connecting upstream (and the proxy handshake), ms. */
  connectTimeoutMs: number;
  /** Most connections handled at once; more are refused. */
  maxConnections: number;
  /** Largest request head, bytes. */
  maxHeadBytes: number;
  /** Trusted roots for upstream servers (PEM): the host's plus `upstream_ca_path`'s. */
  upstreamCa: string[];
  ca: EgressCa;
  /** null: no secrets store (a placeholder then fails its request). */
  resolveSecret: ResolveSecret | null;
  /** The sandbox whose slot has this veth address, or null. */
  lookup: (peerIp: string) => SlotEgress | null;
}

/** Counters (tests, the bench, metrics). */
export interface InterceptorStats {
  accepted: number;
  refused: number;
  terminated: number;
  passedThrough: number;
  requests: number;
  failedRequests: number;
}

/** An error answered to the guest instead of sending its request. */
class EgressRefusal extends Error {
  constructor(
    readonly status: number,
    readonly reason: string,
    message: string,
  ) {
    super(message);
  }
}

/** A Duplex over `sock` that first yields `first` (bytes already read from it). */
function replay(sock: net.Socket, first: Buffer): Duplex {
  const d = new Duplex({
    read() {
      sock.resume();
    },
    write(chunk, _enc, cb) {
      sock.write(chunk, cb);
    },
    final(cb) {
      sock.end();
      cb();
    },
    destroy(err, cb) {
      sock.destroy();
      cb(err);
    },
  });
  if (first.length) d.push(first);
  sock.on("data", (c) => {
    if (!d.push(c)) sock.pause();
  });
  sock.on("end", () => d.push(null));
  sock.on("error", (e) => d.destroy(e));
  sock.on("close", () => d.destroy());
  return d;
}

function refusalResponse(r: EgressRefusal): Buffer {
  const body = `agentenv egress: ${r.message}\n`;
  return Buffer.from(
    `HTTP/1.1 ${r.status} ${r.status === 502 ? "Bad Gateway" : r.status === 431 ? "Request Header Fields Too Large" : "Bad Request"}\r\ncontent-type: text/plain; charset=utf-8\r\nx-agentenv-egress-error: ${r.reason}\r\nconnection: close\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
}

/** See the module comment. `start()`, then `stop()`. */
export class EgressInterceptor {
  private server: net.Server | undefined;
  private readonly open = new Set<net.Socket | Duplex>();
  private readonly log: Logger = logger("net.egress");
  readonly stats: InterceptorStats = { accepted: 0, refused: 0, terminated: 0, passedThrough: 0, requests: 0, failedRequests: 0 };
  /** The bound port (after start). */
  port = 0;

  constructor(private readonly o: InterceptorOptions) {}

  /** Listen on all addresses (the node's INPUT rules admit only redirected slot traffic). @throws Error when the port is taken */
  async start(): Promise<void> {
    const srv = net.createServer({ pauseOnConnect: true }, (s) => void this.accept(s));
    await new Promise<void>((resolve, reject) => {
      srv.once("error", reject);
      srv.listen(this.o.port, "0.0.0.0", () => {
        srv.off("error", reject);
        resolve();
      });
    });
    this.server = srv;
    this.port = (srv.address() as net.AddressInfo).port;
  }

  /** Stop listening and cut every connection. */
  async stop(): Promise<void> {
    const srv = this.server;
    this.server = undefined;
    for (const s of this.open) s.destroy();
    this.open.clear();
    if (srv) await new Promise<void>((r) => srv.close(() => r()));
  }

  private track<T extends net.Socket | Duplex>(s: T): T {
    this.open.add(s);
    s.once("close", () => this.open.delete(s));
    return s;
  }

  private async accept(sock: net.Socket): Promise<void> {
    this.stats.accepted++;
    if (this.open.size >= this.o.maxConnections) {
      this.stats.refused++;
      sock.destroy();
      return;
    }
    this.track(sock);
    sock.on("error", () => sock.destroy());
    const peer = (sock.remoteAddress ?? "").replace(/^::ffff:/, "");
    const ctx = this.o.lookup(peer);
    let orig: { host: string; port: number };
    try {
      if (!ctx) throw new Error(`no sandbox behind ${peer}`);
      orig = originalDestination((sock as unknown as { _handle: { fd: number } })._handle.fd);
    } catch (e) {
      this.stats.refused++;
      this.log.debug({ peer, err: errorMessage(e) }, "egress connection refused");
      sock.destroy();
      return;
    }
    if (ctx.rules.length === 0 || !this.o.interceptPorts.has(orig.port)) return this.passThrough(sock, Buffer.alloc(0), orig, ctx);
    const { bytes, serverName } = await this.readHello(sock);
    if (sock.destroyed) return;
    const rule = serverName ? matchRule(ctx.rules, serverName) : null;
    if (!rule || !serverName) return this.passThrough(sock, bytes, orig, ctx);
    await this.terminate(sock, bytes, serverName, rule, orig, ctx);
  }

  /** The first bytes of `sock` up to a complete ClientHello (or not TLS, or the hello timeout). */
  private readHello(sock: net.Socket): Promise<{ bytes: Buffer; serverName: string | null }> {
    return new Promise((resolve) => {
      let bytes = Buffer.alloc(0);
      const done = (serverName: string | null) => {
        clearTimeout(timer);
        sock.off("data", onData);
        sock.off("end", onEnd);
        sock.pause();
        resolve({ bytes, serverName });
      };
      const onData = (c: Buffer) => {
        bytes = Buffer.concat([bytes, c]);
        const r = parseClientHello(bytes);
        if (r.kind === "hello") done(r.serverName);
        else if (r.kind === "not_tls") done(null);
      };
      const onEnd = () => done(null);
      const timer = setTimeout(() => done(null), this.o.helloTimeoutMs);
      sock.on("data", onData);
      sock.once("end", onEnd);
      sock.resume();
    });
  }

  private async passThrough(sock: net.Socket, first: Buffer, orig: DialTarget, ctx: SlotEgress): Promise<void> {
    this.stats.passedThrough++;
    let up: net.Socket;
    try {
      up = this.track(await dial(orig, ctx.proxy, ctx.isDenied, this.o.connectTimeoutMs));
    } catch (e) {
      this.log.info({ sandboxId: ctx.sandboxId, host: orig.host, port: orig.port, proxied: ctx.proxy !== null, err: errorMessage(e) }, "egress connection failed");
      sock.destroy();
      return;
    }
    up.on("error", () => sock.destroy());
    sock.on("error", () => up.destroy());
    sock.once("close", () => up.destroy());
    up.once("close", () => sock.destroy());
    if (first.length) up.write(first);
    sock.pipe(up);
    up.pipe(sock);
    sock.resume();
  }

  private async terminate(sock: net.Socket, first: Buffer, serverName: string, rule: HostRule, orig: DialTarget, ctx: SlotEgress): Promise<void> {
    this.stats.terminated++;
    const leaf = await this.o.ca.leaf(serverName);
    const guest = this.track(new tls.TLSSocket(replay(sock, first) as unknown as net.Socket, { isServer: true, key: leaf.key, cert: leaf.cert, ALPNProtocols: ["http/1.1"] } as tls.TLSSocketOptions));
    guest.on("error", () => sock.destroy());
    let upstream: tls.TLSSocket | null = null;
    const reader = new RequestReader(this.o.maxHeadBytes);
    /** Answer the refusal and close, before the loop below ends (leaving it destroys the stream). */
    const refuse = async (r: EgressRefusal) => {
      this.stats.failedRequests++;
      this.log.warn({ sandboxId: ctx.sandboxId, host: serverName, reason: r.reason, err: r.message }, "egress request refused");
      upstream?.destroy();
      await new Promise<void>((resolve) => {
        guest.once("finish", resolve);
        guest.once("close", resolve);
        guest.end(refusalResponse(r));
      });
    };
    try {
      for await (const chunk of guest as AsyncIterable<Buffer>) {
        try {
          for (const ev of reader.push(chunk)) {
            if (ev.kind === "error") throw new EgressRefusal(ev.status, "bad_request", ev.message);
            if (ev.kind === "end") continue;
            if (ev.kind === "head") {
              this.stats.requests++;
              const set = await this.headers(rule, serverName);
              upstream ??= await this.connectUpstream(serverName, orig, ctx, guest);
              await write(upstream, serializeHead(ev.head, set));
              continue;
            }
            if (!upstream) throw new EgressRefusal(400, "bad_request", "request bytes before a request head");
            await write(upstream, ev.bytes);
          }
        } catch (e) {
          if (!(e instanceof EgressRefusal)) throw e;
          await refuse(e);
          return;
        }
      }
      upstream?.end();
    } catch (e) {
      this.log.debug({ sandboxId: ctx.sandboxId, host: serverName, err: errorMessage(e) }, "intercepted connection ended by an error");
      guest.destroy();
      upstream?.destroy();
    }
  }

  /** The rule's headers with every placeholder resolved now (values as latin1 strings of their UTF-8 bytes). */
  private async headers(rule: HostRule, host: string): Promise<[string, string][]> {
    const out: [string, string][] = [];
    for (const h of rule.headers) {
      let v = "";
      for (const p of h.parts) {
        if ("text" in p) {
          v += p.text;
          continue;
        }
        if (!this.o.resolveSecret) throw new EgressRefusal(502, "secret_unavailable", `the rule for ${host} names secret "${p.secret}", but this node has no secrets store; the request was not sent`);
        let value: string | null;
        try {
          value = await this.o.resolveSecret(p.secret);
        } catch (e) {
          throw new EgressRefusal(502, "secret_unavailable", `secret "${p.secret}" of the rule for ${host} could not be read (${errorMessage(e)}); the request was not sent`);
        }
        if (value === null) throw new EgressRefusal(502, "secret_not_found", `the rule for ${host} names secret "${p.secret}", which does not exist; the request was not sent`);
        v += Buffer.from(value, "utf8").toString("latin1");
      }
      if (/[\r\n\0]/.test(v)) throw new EgressRefusal(502, "secret_unusable", `a secret of the rule for ${host} holds a line break or NUL, which a header cannot carry; the request was not sent`);
      out.push([h.name, v]);
    }
    return out;
  }

  /** TLS to the original address, verified for `serverName`; its bytes are relayed to `guest`. */
  private async connectUpstream(serverName: string, orig: DialTarget, ctx: SlotEgress, guest: tls.TLSSocket): Promise<tls.TLSSocket> {
    let raw: net.Socket;
    try {
      // the address the guest resolved and the slot's policy admitted, directly or through the proxy
      raw = this.track(await dial(orig, ctx.proxy, ctx.isDenied, this.o.connectTimeoutMs));
    } catch (e) {
      throw new EgressRefusal(502, "upstream_unreachable", `cannot reach ${serverName} (${orig.host}:${orig.port}): ${errorMessage(e)}`);
    }
    const up = this.track(tls.connect({ socket: raw, servername: serverName, ca: this.o.upstreamCa, ALPNProtocols: ["http/1.1"] }));
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new EgressRefusal(502, "upstream_tls", `TLS with ${serverName} did not complete within ${this.o.connectTimeoutMs} ms`)), this.o.connectTimeoutMs);
      up.once("secureConnect", () => {
        clearTimeout(timer);
        resolve();
      });
      up.once("error", (e) => {
        clearTimeout(timer);
        reject(new EgressRefusal(502, "upstream_tls", `the server at ${orig.host}:${orig.port} failed TLS verification for ${serverName}: ${errorMessage(e)}`));
      });
    });
    up.on("error", () => guest.destroy());
    up.on("data", (d: Buffer) => {
      if (!guest.write(d)) up.pause();
    });
    guest.on("drain", () => up.resume());
    up.once("end", () => guest.end());
    up.once("close", () => guest.end());
    return up;
  }
}

/** Write and wait for the writable side to take it (back-pressure). */
function write(s: net.Socket | tls.TLSSocket, bytes: Uint8Array): Promise<void> {
  return new Promise((resolve, reject) => {
    if (s.destroyed) return reject(new Error("upstream closed"));
    s.write(bytes, (e) => (e ? reject(e) : resolve()));
  });
}
