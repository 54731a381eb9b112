import { describe, expect, test } from "bun:test";
import { defaultConfig, loadConfig } from "../../src/config/index.ts";
import { netConfigFromConfig, validateNetConfig } from "../../src/net/config.ts";
import { NetError } from "../../src/net/errors.ts";
import { parseCidr } from "../../src/net/ipv4.ts";
import { parseEgressPolicy } from "../../src/net/policy.ts";
import { dnsScript, hostRules, parseDnsAllowed, policyScript, slotRules } from "../../src/net/rules.ts";
import { guestAddress, netSpec, slotLayout } from "../../src/net/slot.ts";

describe("config", () => {
  test("defaults load: 10.11/16 + 10.12/16, pool 2..64", () => {
    const c = netConfigFromConfig(defaultConfig());
    expect(c.namePrefix).toBe("aenv-");
    expect(c.hostInteractionCidr).toEqual(parseCidr("10.11.0.0/16")!);
    expect(c.vethCidr).toEqual(parseCidr("10.12.0.0/16")!);
    expect(c.pool).toEqual({ low: 2, high: 64, maintenanceEnabled: true, retryBackoffMs: 1000 });
    expect(c.alwaysDenied.length).toBe(6);
  });
  test("bad values name the key", () => {
    const bad = (mut: (t: any) => void, key: string) => {
      const t = defaultConfig() as any;
      mut(t);
      try {
        netConfigFromConfig(t);
        throw new Error("no error");
      } catch (e) {
        expect(e).toBeInstanceOf(NetError);
        expect((e as NetError).code).toBe("net.bad_config");
        expect((e as NetError).details.key).toBe(key);
      }
    };
    bad((t) => (t.network.internal.veth_cidr = "10.12.0.0/33"), "network.internal.veth_cidr");
    bad((t) => (t.network.internal.veth_cidr = "10.11.128.0/24"), "network.internal.veth_cidr");
    bad((t) => (t.network.internal.host_interaction_cidr = "169.254.0.0/24"), "network.internal.host_interaction_cidr");
    bad((t) => (t.network.egress.always_denied_cidrs = ["10.0.0.0/8", "nope"]), "network.egress.always_denied_cidrs[1]");
    bad((t) => (t.pool.low_watermark = 65), "pool.low_watermark");
    bad((t) => (t.network.name_prefix = "Bad_Prefix"), "network.name_prefix");
    bad((t) => (t.network.egress.dns_upstream = ["1.2.3.4:99999"]), "network.egress.dns_upstream[0]");
    // a value outside its key's own type or range is refused by the loader already
    expect(() => loadConfig({ env: {}, tree: { network: { egress: { default_action: "maybe" } } } })).toThrow(
      expect.objectContaining({ code: "config.bad_value", details: expect.objectContaining({ key: "network.egress.default_action" }) }),
    );
    bad((t) => (t.network.max_slots = 40000), "network.max_slots");
  });
});

describe("slot layout", () => {
  const c = netConfigFromConfig(defaultConfig());
  test("addresses derive from the index", () => {
    const s = slotLayout(c, 0);
    expect(s).toMatchObject({
      netnsName: "aenv-0",
      netnsPath: "/run/netns/aenv-0",
      hostVeth: "aenv-0",
      hostVethIp: "10.12.0.0",
      nsVethIp: "10.12.0.1",
      hostIp: "10.11.0.1",
      tapName: "tap0",
      guestIp: "169.254.0.21",
      gatewayIp: "169.254.0.22",
      prefixLen: 30,
      mac: "02:ae:00:00:00:00",
    });
    const t = slotLayout(c, 300);
    expect([t.hostVethIp, t.nsVethIp, t.hostIp, t.mac]).toEqual(["10.12.2.88", "10.12.2.89", "10.11.1.45", "02:ae:00:00:01:2c"]);
    expect(guestAddress(t, 49983)).toEqual({ host: "10.11.1.45", port: 49983 });
    expect(netSpec(t)).toEqual({ netnsPath: "/run/netns/aenv-300", tapName: "tap0", mac: "02:ae:00:00:01:2c", guestIp: "169.254.0.21", gatewayIp: "169.254.0.22", prefixLen: 30 });
    expect(() => slotLayout(c, c.maxSlots)).toThrow(RangeError);
    expect(() => guestAddress(t, 0)).toThrow(RangeError);
  });
});

describe("rules", () => {
  const c = netConfigFromConfig(defaultConfig());
  validateNetConfig(c);
  const s = slotLayout(c, 1);
  test("policy chain: allows first, then always-denied, denyOut, internet", () => {
    const p = parseEgressPolicy({ allowOut: ["10.1.2.3", "*.example.com"], denyOut: ["8.8.8.0/24"], allow_internet_access: true });
    const lines = policyScript(c, p, [{ ip: "93.184.216.34", qname: "www.example.com", expiresAt: 1_700_000_000_000 }]).split("\n");
    const policy = lines.filter((l) => l.startsWith("-A AENV-POLICY"));
    expect(policy[0]).toBe("-A AENV-POLICY -d 10.1.2.3/32 -j ACCEPT");
    expect(policy[1]).toBe("-A AENV-POLICY -j AENV-DNS");
    expect(policy.slice(2, 8).every((l) => l.endsWith("-j AENV-DENY"))).toBe(true);
    expect(policy[8]).toBe("-A AENV-POLICY -d 8.8.8.0/24 -j AENV-DENY");
    expect(policy[9]).toBe("-A AENV-POLICY -j ACCEPT");
    expect(lines).toContain('-A AENV-DNS -d 93.184.216.34/32 -m comment --comment "aenv-dns www.example.com 1700000000000" -j ACCEPT');
    const closed = policyScript(c, parseEgressPolicy({ allow_internet_access: false }), []);
    expect(closed.trim().split("\n").at(-2)).toBe("-A AENV-POLICY -j AENV-DENY");
  });
  test("DNS-learned rules carry their name and expiry; iptables-save's form of them reads back, an older node's plain rule too", () => {
    const entries = [
      { ip: "93.184.216.34", qname: "www.example.com", expiresAt: 1_700_000_000_000 },
      { ip: "10.0.0.9", qname: "x y\"z.example.com", expiresAt: 5.5 }, // no name a comment can hold: "?"
    ];
    const script = dnsScript(entries);
    expect(script.split("\n")).toContain('-A AENV-DNS -d 10.0.0.9/32 -m comment --comment "aenv-dns ? 5" -j ACCEPT');
    // as iptables-save prints them (the comment quoted), with a rule of another chain and a plain one
    const save = [
      "*filter",
      ":AENV-DNS - [0:0]",
      '-A AENV-DNS -d 93.184.216.34/32 -m comment --comment "aenv-dns www.example.com 1700000000000" -j ACCEPT',
      '-A AENV-DNS -d 10.0.0.9/32 -m comment --comment "aenv-dns ? 5" -j ACCEPT',
      "-A AENV-DNS -d 1.2.3.4/32 -j ACCEPT",
      "-A AENV-POLICY -d 1.1.1.1/32 -j ACCEPT",
      "COMMIT",
    ].join("\n");
    expect(parseDnsAllowed(save, 42)).toEqual([
      { ip: "93.184.216.34", qname: "www.example.com", expiresAt: 1_700_000_000_000 },
      { ip: "10.0.0.9", qname: "?", expiresAt: 5 },
      { ip: "1.2.3.4", qname: "?", expiresAt: 42 },
    ]);
    expect(parseDnsAllowed("", 1)).toEqual([]);
  });
  test("a slot's rules replacing a live slot's flush its built-in chains first, in the same commit", () => {
    const r = slotRules(c, s, parseEgressPolicy({}), [], true).split("\n");
    expect(r.slice(0, 3)).toEqual(["*nat", "-F PREROUTING", "-F POSTROUTING"]);
    const f = r.indexOf("*filter");
    expect(r.slice(f, f + 3)).toEqual(["*filter", "-F INPUT", "-F FORWARD"]);
    expect(r.filter((l) => l === "COMMIT").length).toBe(2);
    expect(slotRules(c, s, parseEgressPolicy({})).split("\n")).not.toContain("-F FORWARD");
  });
  test("slot and host scripts carry the NAT of this slot and the prefix wildcard", () => {
    const r = slotRules(c, s, parseEgressPolicy({}));
    expect(r).toContain(`-A PREROUTING -i veth0 -d 10.11.0.2/32 -j DNAT --to-destination 169.254.0.21`);
    expect(r).toContain(`-A PREROUTING -i tap0 -p udp --dport 53 -j DNAT --to-destination 10.12.0.2:10053`);
    expect(r).toContain(`-A POSTROUTING -o veth0 -s 169.254.0.21/32 -j SNAT --to-source 10.12.0.3`);
    // forged guest sources are dropped before the policy is consulted
    const fwd = r.split("\n").filter((l) => l.startsWith("-A FORWARD -i tap0"));
    expect(fwd[0]).toBe("-A FORWARD -i tap0 ! -s 169.254.0.21/32 -j DROP");
    expect(fwd[1]).toBe("-A FORWARD -i tap0 -o veth0 -j AENV-EGRESS");
    expect(r).toContain("-A AENV-DENY -p tcp -j REJECT --reject-with tcp-reset");
    const h = hostRules(c);
    expect(h).toContain("-A aenv-fwd -i aenv-+ -o aenv-+ -j DROP");
    expect(h).toContain("-A aenv-post -s 10.12.0.0/16 ! -o aenv-+ -j MASQUERADE");
    expect(h).toContain("-A aenv-in ! -i aenv-+ -p udp --dport 10053 -j DROP");
    expect(h).toContain("-A aenv-in ! -i aenv-+ -p tcp --dport 10053 -j DROP");
  });
});
