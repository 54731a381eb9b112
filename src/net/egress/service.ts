/**
 * The egress side of a NetworkManager: the node CA, the interceptor, and the redirect chain kept
 * in step with the allocated slots' policies (rules and egress proxies). Also the checks of a
 * policy that need the node: the rules' secrets exist, the feature is on, the node's limit on
 * rule domains.
 */
import { readFileSync } from "node:fs";
import { rootCertificates } from "node:tls";
import type { Logger } from "pino";
import { logger } from "../../observability/log.ts";
import { errorMessage } from "../../util/error.ts";
import type { NetConfig } from "../config.ts";
import { NetError } from "../errors.ts";
import { cidrContains, parseIpv4 } from "../ipv4.ts";
import { restoreIn } from "../netns.ts";
import type { EgressPolicy } from "../policy.ts";
import type { AllocatedSlot } from "../slot.ts";
import { EgressCa } from "./ca.ts";
import { EgressInterceptor, type InterceptorStats, type ResolveSecret, type SlotEgress } from "./interceptor.ts";
import { redirectScript, type RedirectedSlot } from "./redirect.ts";
import { referencedSecrets } from "./rules.ts";

/** What the node gives the egress service. */
export interface EgressDeps {
  /** Current value of a secret by name (null: no such secret); absent: no secrets store. */
  resolveSecret?: ResolveSecret;
  /** Goes into the CA's subject (the node id). */
  label?: string;
}

/** The egress CA, interceptor and redirect chain of one node. */
export class EgressService {
  private ca: EgressCa | undefined;
  private interceptor: EgressInterceptor | undefined;
  private applied = "";
  private syncing: Promise<void> = Promise.resolve();
  private readonly log: Logger = logger("net.egress");

  constructor(
    private readonly cfg: () => NetConfig,
    private readonly deps: EgressDeps,
    private readonly lookupSlot: (peerIp: string) => AllocatedSlot | undefined,
  ) {}

  /**
   * Open (or make) the CA and start the interceptor.
   * @returns the bound listen port
   * @throws NetError `net.bad_config` (CA files, upstream_ca_path), `net.dns_bind`-like bind failure as `net.bad_config`
   */
  async start(): Promise<number> {
    const e = this.cfg().egress;
    this.ca = await EgressCa.open(e.caDir, this.deps.label ?? "node");
    let extra: string[] = [];
    if (e.upstreamCaPath) {
      try {
        extra = readFileSync(e.upstreamCaPath, "utf8").match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
      } catch (err) {
        throw new NetError("net.bad_config", `network.egress.upstream_ca_path ${e.upstreamCaPath}: ${errorMessage(err)}`, { key: "network.egress.upstream_ca_path", value: e.upstreamCaPath });
      }
      if (extra.length === 0) throw new NetError("net.bad_config", `network.egress.upstream_ca_path ${e.upstreamCaPath} holds no PEM certificate`, { key: "network.egress.upstream_ca_path", value: e.upstreamCaPath });
    }
    this.interceptor = new EgressInterceptor({
      port: e.port,
      interceptPorts: new Set([443, ...e.interceptPorts]),
      helloTimeoutMs: e.helloTimeoutMs,
      connectTimeoutMs: e.connectTimeoutMs,
      maxConnections: e.maxConnections,
      maxHeadBytes: e.maxHeadBytes,
      upstreamCa: [...rootCertificates, ...extra],
      ca: this.ca,
      resolveSecret: this.deps.resolveSecret ?? null,
      lookup: (ip) => this.slotEgress(ip),
    });
    try {
      await this.interceptor.start();
    } catch (err) {
      throw new NetError("net.bad_config", `network.egress.interceptor_port ${e.port}: cannot listen: ${errorMessage(err)}`, { key: "network.egress.interceptor_port", value: e.port });
    }
    return this.interceptor.port;
  }

  async stop(): Promise<void> {
    await this.interceptor?.stop();
  }

  /** The CA certificate guests should trust (PEM), or null before start. */
  caBundle(): string | null {
    return this.ca?.certPem ?? null;
  }

  /** The interceptor's counters. */
  stats(): InterceptorStats | null {
    return this.interceptor?.stats ?? null;
  }

  /**
   * Check what of `policy` depends on the node: the feature is on, the rule domains are within
   * `max_rule_domains`, an egress proxy's IP literal is not in a denied range, and (`o.secrets`)
   * every secret the rules name exists.
   * @throws NetError `net.bad_policy` naming the field
   */
  async check(policy: EgressPolicy, enabled: boolean, o: { secrets: boolean }): Promise<void> {
    const e = this.cfg().egress;
    if (!enabled && policy.rules.length) throw new NetError("net.bad_policy", "network.rules: this node does not intercept egress ([network.egress] interceptor_enabled = false)", { field: "network.rules" });
    if (!enabled && policy.egressProxy) throw new NetError("net.bad_policy", "network.egressProxy: this node does not intercept egress ([network.egress] interceptor_enabled = false)", { field: "network.egressProxy" });
    if (policy.rules.length > e.maxRuleDomains) throw new NetError("net.bad_policy", `network.rules: at most ${e.maxRuleDomains} domains`, { field: "network.rules" });
    const p = policy.egressProxy;
    const ip = p ? parseIpv4(p.host) : null;
    if (p && ip !== null && deniedFor(this.cfg(), policy)(ip)) {
      throw new NetError("net.bad_policy", `network.egressProxy.address: ${p.host} is in a range sandboxes may not reach (network.egress.always_denied_cidrs); allowOut it to use it`, { field: "network.egressProxy.address" });
    }
    if (!o.secrets) return;
    for (const [name, field] of referencedSecrets(policy.rules)) {
      if (!this.deps.resolveSecret) throw new NetError("net.bad_policy", `${field}: names secret "${name}", but this node has no secrets store`, { field });
      let v: string | null;
      try {
        v = await this.deps.resolveSecret(name);
      } catch (err) {
        throw new NetError("net.bad_policy", `${field}: secret "${name}" cannot be looked up now: ${errorMessage(err)}`, { field });
      }
      if (v === null) throw new NetError("net.bad_policy", `${field}: secret "${name}" does not exist (create it with Secret.create / POST /secrets)`, { field });
    }
  }

  /** Rewrite the redirect chain for `slots` (the allocated ones) when it changed. Serialised. */
  sync(slots: Iterable<AllocatedSlot>): Promise<void> {
    const cfg = this.cfg();
    const list: RedirectedSlot[] = [];
    for (const a of slots) {
      if (a.policy.egressProxy) list.push({ hostVeth: a.hostVeth, allPorts: true, ports: [] });
      else if (a.policy.rules.length) list.push({ hostVeth: a.hostVeth, allPorts: false, ports: [443, ...cfg.egress.interceptPorts] });
    }
    const script = redirectScript(cfg.namePrefix, cfg.egress.port, list);
    const run = async () => {
      if (script === this.applied) return;
      await restoreIn(null, script, cfg.commandTimeoutMs);
      this.applied = script;
    };
    const next = this.syncing.then(run, run);
    this.syncing = next.catch((err) => this.log.error({ err }, "egress redirect chain not updated"));
    return next;
  }

  private slotEgress(peerIp: string): SlotEgress | null {
    const a = this.lookupSlot(peerIp);
    if (!a) return null;
    return { sandboxId: a.sandboxId, rules: a.policy.rules, proxy: a.policy.egressProxy, isDenied: deniedFor(this.cfg(), a.policy) };
  }
}

/** Whether an IPv4 address (as a number) is one the sandbox may not reach: in an always-denied range and in none of its allowOut CIDRs. */
export function deniedFor(cfg: NetConfig, policy: EgressPolicy): (ip: number) => boolean {
  return (ip) => cfg.alwaysDenied.some((d) => cidrContains(d, ip)) && !policy.allowCidrs.some((a) => cidrContains(a, ip));
}
