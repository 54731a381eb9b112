/**
 * Typed settings of the network subsystem, read from the `[network]`, `[network.internal]`,
 * `[network.egress]`, `[pool]` and `[pool.network]` sections of the node config
 * (defaults and meaning of every key: config/default.toml).
 */
import { type ConfigTable, get } from "../config/index.ts";
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
    /** Period of the expiry scan of DNS-learned addresses. */
    sweepIntervalMs: number;
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

function cidrKey(key: string, v: unknown): Cidr {
  const c = typeof v === "string" ? parseCidr(v) : null;
  if (!c) throw badConfig(key, v, "not a valid IPv4 CIDR");
  return c;
}

function intKey(key: string, v: unknown, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw badConfig(key, v, `must be an integer in ${min}..${max}`);
  }
  return v;
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
export function netConfigFromConfig(cfg: ConfigTable): NetConfig {
  const g = <T>(k: string) => get(cfg, k) as unknown as T;
  const upstream = g<unknown[]>("network.egress.dns_upstream").map((e, i) => {
    const key = `network.egress.dns_upstream[${i}]`;
    const m = typeof e === "string" ? /^([0-9.]+)(?::([0-9]{1,5}))?$/.exec(e) : null;
    if (!m || parseIpv4(m[1]!) === null) throw badConfig(key, e, "must be \"ip\" or \"ip:port\"");
    return { ip: m[1]!, port: intKey(key, Number(m[2] ?? 53), 1, 65535) };
  });
  const action = g<string>("network.egress.default_action");
  if (action !== "allow" && action !== "deny") throw badConfig("network.egress.default_action", action, "must be allow or deny");
  const c: NetConfig = {
    namePrefix: g<string>("network.name_prefix"),
    maxSlots: intKey("network.max_slots", g("network.max_slots"), 1, 32768),
    commandTimeoutMs: intKey("network.command_timeout_ms", g("network.command_timeout_ms"), 100, 600_000),
    enableIpForward: g<boolean>("network.enable_ip_forward"),
    hostInteractionCidr: cidrKey("network.internal.host_interaction_cidr", g("network.internal.host_interaction_cidr")),
    vethCidr: cidrKey("network.internal.veth_cidr", g("network.internal.veth_cidr")),
    alwaysDenied: g<unknown[]>("network.egress.always_denied_cidrs").map((v, i) => cidrKey(`network.egress.always_denied_cidrs[${i}]`, v)),
    defaultAction: action,
    dns: {
      enabled: g<boolean>("network.egress.dns_proxy_enabled"),
      port: intKey("network.egress.dns_proxy_port", g("network.egress.dns_proxy_port"), 0, 65535),
      upstream,
      timeoutMs: intKey("network.egress.dns_timeout_ms", g("network.egress.dns_timeout_ms"), 10, 60_000),
      maxInflight: intKey("network.egress.dns_max_inflight", g("network.egress.dns_max_inflight"), 1, 65536),
      maxAddressesPerSlot: intKey("network.egress.dns_max_addresses_per_slot", g("network.egress.dns_max_addresses_per_slot"), 1, 65536),
      minTtlSecs: intKey("network.egress.dns_min_ttl_secs", g("network.egress.dns_min_ttl_secs"), 0, 86_400),
      sweepIntervalMs: intKey("network.egress.dns_sweep_interval_ms", g("network.egress.dns_sweep_interval_ms"), 10, 3_600_000),
    },
    pool: {
      low: intKey("pool.low_watermark", g("pool.low_watermark"), 0, 32768),
      high: intKey("pool.high_watermark", g("pool.high_watermark"), 0, 32768),
      maintenanceEnabled: g<boolean>("pool.network.maintenance_enabled"),
      retryBackoffMs: intKey("pool.network.retry_backoff_ms", g("pool.network.retry_backoff_ms"), 1, 600_000),
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
