/**
 * Typed settings of the network subsystem, read from the `[network]`, `[network.internal]`,
 * `[network.egress]`, `[pool]` and `[pool.network]` sections of the node config
 * (defaults and meaning of every key: config/default.toml).
 */
import { join } from "node:path";
import type { Config } from "../config/index.ts";
import { NetError } from "./errors.ts";
import { type Cidr, cidrSize, cidrsOverlap, formatCidr, parseCidr, parseIpv4 } from "./ipv4.ts";

/** The VM tap link every slot uses: 169.254.0.20/30 (gateway .22 in the netns, guest .21). */
export const TAP_LINK: Cidr = { base: parseIpv4("169.254.0.20")!, prefix: 30 };

/** Network subsystem settings; times in ms, TTLs in seconds. */
export interface NetConfig {
  /** Prefix of every netns, host veth and host iptables chain we create; reaping matches it. */
  namePrefix: string;
  /** Hard bound on slots (pooled + allocated + being built). */
  maxSlots: number;
  /** Time limit of one `ip`/`iptables-restore` invocation. */
  commandTimeoutMs: number;
  /** Set net.ipv4.ip_forward=1 in the node's namespace at start. */
  enableIpForward: boolean;
  /** One address per slot: what the node connects to to reach the guest (DNAT in the netns). */
  hostInteractionCidr: Cidr;
  /** Two addresses (/31) per slot: host veth end (even) and namespace veth end (odd). */
  vethCidr: Cidr;
  alwaysDenied: Cidr[];
  /** What happens to egress no rule matched, when the sandbox has internet access. */
  defaultAction: "allow" | "deny";
  dns: {
    enabled: boolean;
    /** UDP port the node's DNS proxy listens on (all addresses; INPUT rules admit slot veths only); 0 = any free port. */
    port: number;
    /** Upstream resolvers as {ip, port}; empty = nameservers of /etc/resolv.conf. */
    upstream: { ip: string; port: number }[];
    timeoutMs: number;
    maxInflight: number;
    maxAddressesPerSlot: number;
    minTtlSecs: number;
  };
  /** The egress interceptor (src/net/egress). */
  egress: {
    enabled: boolean;
    /** Listen port; after `start()`, the bound one. */
    port: number;
    /** Intercepted ports besides 443. */
    interceptPorts: number[];
    upstreamCaPath: string;
    caDir: string;
    helloTimeoutMs: number;
    connectTimeoutMs: number;
    maxConnections: number;
    maxHeadBytes: number;
    maxRuleDomains: number;
  };
  pool: {
    low: number;
    high: number;
    maintenanceEnabled: boolean;
    /** Wait after a failed background build before the worker tries again. */
    retryBackoffMs: number;
  };
}

function badConfig(key: string, value: unknown, why: string): NetError {
  return new NetError("net.bad_config", `${key} = ${JSON.stringify(value)}: ${why}`, { key, value });
}

function cidrKey(key: string, v: string): Cidr {
  const c = parseCidr(v);
  if (!c) throw badConfig(key, v, "not a valid IPv4 CIDR");
  return c;
}

/** How many slots the two address ranges can number. */
export function rangeCapacity(hostInteraction: Cidr, veth: Cidr): number {
  return Math.min(cidrSize(hostInteraction) - 2, Math.floor(cidrSize(veth) / 2));
}

/**
 * Read and validate the network settings.
 * @throws NetError `net.bad_config` naming the key and value (bad CIDR, overlapping ranges,
 *   prefix too long for 15-byte interface names, low > high watermark, ...).
 */
export function netConfigFromConfig(cfg: Config): NetConfig {
  const n = cfg.network;
  const e = n.egress;
  const upstream = e.dns_upstream.map((entry, i) => {
    const key = `network.egress.dns_upstream[${i}]`;
    const m = /^([0-9.]+)(?::([0-9]{1,5}))?$/.exec(entry);
    const port = Number(m?.[2] ?? 53);
    if (!m || parseIpv4(m[1]!) === null || port < 1 || port > 65535) throw badConfig(key, entry, 'must be "ip" or "ip:port"');
    return { ip: m[1]!, port };
  });
  if (e.intercept_ports.length > 14) throw badConfig("network.egress.intercept_ports", e.intercept_ports, "at most 14 ports");
  const interceptPorts = e.intercept_ports.map((v, i) => {
    const n = Number(v);
    if (!/^[0-9]{1,5}$/.test(v) || n < 1 || n > 65535) throw badConfig(`network.egress.intercept_ports[${i}]`, v, "must be a port 1..65535");
    return n;
  });
  const c: NetConfig = {
    namePrefix: n.name_prefix,
    maxSlots: n.max_slots,
    commandTimeoutMs: n.command_timeout_ms,
    enableIpForward: n.enable_ip_forward,
    hostInteractionCidr: cidrKey("network.internal.host_interaction_cidr", n.internal.host_interaction_cidr),
    vethCidr: cidrKey("network.internal.veth_cidr", n.internal.veth_cidr),
    alwaysDenied: e.always_denied_cidrs.map((v, i) => cidrKey(`network.egress.always_denied_cidrs[${i}]`, v)),
    defaultAction: e.default_action,
    dns: {
      enabled: e.dns_proxy_enabled,
      port: e.dns_proxy_port,
      upstream,
      timeoutMs: e.dns_timeout_ms,
      maxInflight: e.dns_max_inflight,
      maxAddressesPerSlot: e.dns_max_addresses_per_slot,
      minTtlSecs: e.dns_min_ttl_secs,
    },
    egress: {
      enabled: e.interceptor_enabled,
      port: e.interceptor_port,
      interceptPorts: [...new Set(interceptPorts.filter((p) => p !== 443))],
      upstreamCaPath: e.upstream_ca_path,
      caDir: e.ca_dir || join(cfg.home_path, "egress-ca"),
      helloTimeoutMs: e.client_hello_timeout_ms,
      connectTimeoutMs: e.upstream_connect_timeout_ms,
      maxConnections: e.interceptor_max_connections,
      maxHeadBytes: e.max_request_head_bytes,
      maxRuleDomains: e.max_rule_domains,
    },
    pool: {
      low: cfg.pool.low_watermark,
      high: cfg.pool.high_watermark,
      maintenanceEnabled: cfg.pool.network.maintenance_enabled,
      retryBackoffMs: cfg.pool.network.retry_backoff_ms,
    },
  };
  validateNetConfig(c);
  return c;
}

/**
 * Check the cross-key invariants of a NetConfig (also for configs built by hand in tests).
 * @throws NetError `net.bad_config`.
 */
export function validateNetConfig(c: NetConfig): void {
  if (!/^[a-z][a-z0-9-]{0,9}$/.test(c.namePrefix)) {
    throw badConfig("network.name_prefix", c.namePrefix, "must match [a-z][a-z0-9-]{0,9}");
  }
  if (c.namePrefix.length + String(c.maxSlots - 1).length > 15) {
    throw badConfig("network.name_prefix", c.namePrefix, `prefix + slot index exceeds the 15-byte interface name limit for max_slots ${c.maxSlots}`);
  }
  const ranges: [string, Cidr][] = [
    ["network.internal.host_interaction_cidr", c.hostInteractionCidr],
    ["network.internal.veth_cidr", c.vethCidr],
  ];
  for (const [key, r] of ranges) {
    if (cidrsOverlap(r, TAP_LINK)) throw badConfig(key, formatCidr(r), "overlaps the VM tap link 169.254.0.20/30");
    if (r.prefix > 30) throw badConfig(key, formatCidr(r), "must be /30 or larger");
  }
  if (cidrsOverlap(c.hostInteractionCidr, c.vethCidr)) {
    throw badConfig("network.internal.veth_cidr", formatCidr(c.vethCidr), "overlaps network.internal.host_interaction_cidr");
  }
  const cap = rangeCapacity(c.hostInteractionCidr, c.vethCidr);
  if (c.maxSlots > cap) throw badConfig("network.max_slots", c.maxSlots, `the address ranges number only ${cap} slots`);
  if (c.pool.low > c.pool.high) throw badConfig("pool.low_watermark", c.pool.low, `exceeds pool.high_watermark ${c.pool.high}`);
  if (c.pool.high > c.maxSlots) throw badConfig("pool.high_watermark", c.pool.high, `exceeds network.max_slots ${c.maxSlots}`);
}
