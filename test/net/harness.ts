/**
 * Test world for the real-namespace network tests (root required). Everything lives in
 * namespaces the test makes and in 169.254.0.0/16:
 *   <p>node  the "node": runs the agent fixture (a NetworkManager) via nsenter; slots hang off it
 *   <p>inet  the "outside": test servers on 169.254.200.2 and .3, linked to the node by inet0
 *   <p>g<i>  a stand-in guest for slot i: the slot's tap0 is replaced by a veth to this netns,
 *            guest 169.254.0.21/30 via 169.254.0.22, exactly what the VM would have
 * No packet leaves these namespaces.
 */
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";

const FIX = join(import.meta.dir, "fixtures");
const BUN = process.execPath;

/** Run a command synchronously; throws on rc ≠ 0 unless allowFail. */
export function sh(cmd: string[], opts: { stdin?: string; allowFail?: boolean } = {}): { rc: number; out: string; err: string } {
  const r = Bun.spawnSync(cmd, { stdin: opts.stdin ? new TextEncoder().encode(opts.stdin) : undefined, stdout: "pipe", stderr: "pipe" });
  const res = { rc: r.exitCode ?? -1, out: r.stdout.toString(), err: r.stderr.toString() };
  if (res.rc !== 0 && !opts.allowFail) throw new Error(`${cmd.join(" ")} → ${res.rc}: ${res.err}`);
  return res;
}

/** A reply of the agent fixture. */
export interface AgentReply {
  id: number;
  ok: boolean;
  result?: any;
  error?: { code?: string; message: string; details?: any };
}

/** A NetworkManager living in its own process inside the node netns. */
export class Agent {
  private next = 1;
  private waiting = new Map<number, (r: AgentReply) => void>();
  private buf = "";
  readonly started: Promise<AgentReply>;

  constructor(readonly proc: Subprocess<"pipe", "pipe", "inherit">) {
    let first: (r: AgentReply) => void;
    this.started = new Promise((res) => (first = res));
    this.waiting.set(0, first!);
    void this.pump();
  }

  private async pump(): Promise<void> {
    for await (const chunk of this.proc.stdout) {
      this.buf += new TextDecoder().decode(chunk);
      let nl: number;
      while ((nl = this.buf.indexOf("\n")) >= 0) {
        const r = JSON.parse(this.buf.slice(0, nl)) as AgentReply;
        this.buf = this.buf.slice(nl + 1);
        this.waiting.get(r.id)?.(r);
        this.waiting.delete(r.id);
      }
    }
  }

  /** Send one op and wait for its reply. */
  call(op: string, args: Record<string, unknown> = {}): Promise<AgentReply> {
    const id = this.next++;
    const p = new Promise<AgentReply>((res) => this.waiting.set(id, res));
    this.proc.stdin.write(JSON.stringify({ id, op, ...args }) + "\n");
    this.proc.stdin.flush();
    return p;
  }

  /** Like call() but throws unless ok. */
  async ok(op: string, args: Record<string, unknown> = {}): Promise<any> {
    const r = await this.call(op, args);
    if (!r.ok) throw new Error(`${op} failed: ${JSON.stringify(r.error)}`);
    return r.result;
  }
}

/** One test world; `cleanup()` removes every namespace it (or its agents) made. */
export class World {
  readonly prefix: string;
  readonly nodeNs: string;
  readonly inetNs: string;
  readonly dir: string;
  readonly db: string;
  private readonly procs: Subprocess[] = [];
  private readonly extraNs: string[] = [];

  constructor() {
    this.prefix = `at${Math.floor(Math.random() * 0xffff).toString(16).padStart(4, "0")}-`;
    this.nodeNs = `${this.prefix}node`;
    this.inetNs = `${this.prefix}inet`;
    this.dir = mkdtempSync(join(tmpdir(), "net-test-"));
    this.db = join(this.dir, "node.db");
    sh(["ip", "netns", "add", this.nodeNs]);
    sh(["ip", "netns", "add", this.inetNs]);
    sh(["ip", "-n", this.nodeNs, "-batch", "-"], {
      stdin: [
        "link set lo up",
        `link add inet0 type veth peer name eth0 netns ${this.inetNs}`,
        "addr add 169.254.200.1/24 dev inet0",
        "link set inet0 up",
        "",
      ].join("\n"),
    });
    sh(["ip", "-n", this.inetNs, "-batch", "-"], {
      stdin: ["link set lo up", "addr add 169.254.200.2/24 dev eth0", "addr add 169.254.200.3/24 dev eth0", "link set eth0 up", ""].join("\n"),
    });
  }

  /** Config tree overrides every agent of this world starts with. */
  config(over: Record<string, any> = {}): Record<string, any> {
    const base: Record<string, any> = {
      // the egress CA and anything else of a data dir stay in the world's own directory
      home_path: this.dir,
      network: {
        name_prefix: this.prefix,
        max_slots: 4,
        command_timeout_ms: 10000,
        enable_ip_forward: true,
        internal: { host_interaction_cidr: "169.254.64.0/24", veth_cidr: "169.254.128.0/24" },
        egress: { default_action: "deny", dns_proxy_enabled: true, dns_proxy_port: 0, interceptor_port: 0, dns_upstream: ["169.254.200.2:53"], dns_timeout_ms: 1000, dns_min_ttl_secs: 0 },
      },
      pool: { low_watermark: 1, high_watermark: 2, network: { maintenance_enabled: true, retry_backoff_ms: 100 } },
    };
    const merge = (a: any, b: any) => {
      for (const [k, v] of Object.entries(b)) {
        if (v && typeof v === "object" && !Array.isArray(v)) merge((a[k] ??= {}), v);
        else a[k] = v;
      }
    };
    merge(base, over);
    return base;
  }

  /**
   * Start an agent (NetworkManager process) in the node netns and wait for start() to finish;
   * `keep`: the sandboxes whose slots it adopts (`start({ keep })`).
   */
  async agent(over: Record<string, any> = {}, keep?: { sandboxId: string; policy?: unknown }[]): Promise<{ agent: Agent; start: AgentReply }> {
    const proc = Bun.spawn(
      ["nsenter", `--net=/run/netns/${this.nodeNs}`, BUN, join(FIX, "agent.ts"), JSON.stringify({ db: this.db, config: this.config(over), keep })],
      { stdin: "pipe", stdout: "pipe", stderr: "inherit", env: { ...process.env, AENV_LOG_LEVEL: "error" } },
    );
    this.procs.push(proc);
    const agent = new Agent(proc as Subprocess<"pipe", "pipe", "inherit">);
    const start = await agent.started;
    return { agent, start };
  }

  /** Start test servers in the inet netns (see fixtures/server.ts) and wait until they listen. */
  async servers(spec: unknown, ns = this.inetNs): Promise<void> {
    const proc = Bun.spawn(["nsenter", `--net=/run/netns/${ns}`, BUN, join(FIX, "server.ts"), JSON.stringify(spec)], {
      stdout: "pipe",
      stderr: "inherit",
    });
    this.procs.push(proc);
    const reader = proc.stdout.getReader();
    const { value } = await reader.read();
    reader.releaseLock();
    if (!new TextDecoder().decode(value).includes("ready")) throw new Error("test server did not start");
  }

  /** Replace slot `idx`'s tap with a veth to a fresh guest netns; returns the guest netns name. */
  attachGuest(slot: { idx: number; netnsName: string }): string {
    const g = `${this.prefix}g${slot.idx}`;
    sh(["ip", "netns", "del", g], { allowFail: true });
    sh(["ip", "netns", "add", g]);
    this.extraNs.push(g);
    sh(["ip", "-n", slot.netnsName, "-batch", "-"], {
      stdin: ["link del tap0", `link add tap0 type veth peer name eth0 netns ${g}`, "addr add 169.254.0.22/30 dev tap0", "link set tap0 up", ""].join("\n"),
    });
    sh(["ip", "-n", g, "-batch", "-"], {
      stdin: ["link set lo up", "addr add 169.254.0.21/30 dev eth0", "link set eth0 up", "route add default via 169.254.0.22", ""].join("\n"),
    });
    return g;
  }

  /** TCP connect from inside `ns`; ok with the greeting or the error. */
  tcp(ns: string, ip: string, port: number, timeoutMs = 1500): { ok: boolean; data?: string; error?: string } {
    const r = sh(["nsenter", `--net=/run/netns/${ns}`, BUN, join(FIX, "probe.ts"), "tcp", ip, String(port), String(timeoutMs)]);
    return JSON.parse(r.out.trim().split("\n").pop()!);
  }

  /** DNS A query from inside `ns` to `server`:53. */
  dns(ns: string, server: string, name: string, timeoutMs = 2500, sourceIp?: string): { ok: boolean; rcode?: number; addrs?: string[]; error?: string } {
    const src = sourceIp ? [sourceIp] : [];
    const r = sh(["nsenter", `--net=/run/netns/${ns}`, BUN, join(FIX, "probe.ts"), "dns", server, name, String(timeoutMs), ...src]);
    return JSON.parse(r.out.trim().split("\n").pop()!);
  }

  /** DNS A query over TCP from inside `ns` to `server`:53. */
  dnsTcp(ns: string, server: string, name: string, timeoutMs = 2500): { ok: boolean; rcode?: number; addrs?: string[]; error?: string } {
    const r = sh(["nsenter", `--net=/run/netns/${ns}`, BUN, join(FIX, "probe.ts"), "dnstcp", server, name, String(timeoutMs)]);
    return JSON.parse(r.out.trim().split("\n").pop()!);
  }

  /** Our slot namespaces currently pinned (`<prefix><digits>`). */
  slotNetns(): string[] {
    const re = new RegExp(`^${this.prefix}[0-9]+$`);
    return existsSync("/run/netns") ? readdirSync("/run/netns").filter((n) => re.test(n)).sort() : [];
  }

  /** Our host veths in the node netns. */
  slotLinks(): string[] {
    const re = new RegExp(`^${this.prefix}[0-9]+$`);
    return sh(["ip", "-n", this.nodeNs, "-o", "link", "show"])
      .out.split("\n")
      .map((l) => /^\d+:\s+([^:@\s]+)/.exec(l)?.[1])
      .filter((n): n is string => !!n && re.test(n))
      .sort();
  }

  /** Lines of iptables-save in the node netns that mention our prefix. */
  ourRules(): string[] {
    const out = sh(["nsenter", `--net=/run/netns/${this.nodeNs}`, "iptables-save"]).out;
    return out.split("\n").filter((l) => l.includes(this.prefix));
  }

  /** Kill our processes, delete every namespace of this world (slots included), remove files. */
  async cleanup(): Promise<void> {
    for (const p of this.procs) {
      try {
        p.kill("SIGKILL");
      } catch {}
      await p.exited;
    }
    for (const ns of [...this.slotNetns(), ...this.extraNs, this.nodeNs, this.inetNs]) sh(["ip", "netns", "del", ns], { allowFail: true });
    rmSync(this.dir, { recursive: true, force: true });
  }
}
