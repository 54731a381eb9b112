import { describe, expect, test } from "bun:test";
import { NetError } from "../../src/net/errors.ts";
import { cidrContains, cidrsOverlap, formatCidr, parseCidr, parseIpv4 } from "../../src/net/ipv4.ts";
import { domainMatches, parseDomainPattern } from "../../src/net/domain.ts";
import { parseCreateNetwork, parseEgressPolicy, policyToJson } from "../../src/net/policy.ts";

function policyError(json: unknown): NetError {
  try {
    parseEgressPolicy(json);
  } catch (e) {
    expect(e).toBeInstanceOf(NetError);
    return e as NetError;
  }
  throw new Error(`expected NetError for ${JSON.stringify(json)}`);
}

describe("ipv4", () => {
  test("parses strict dotted quads and CIDRs, normalising host bits", () => {
    expect(parseIpv4("169.254.0.21")).toBe(0xa9fe0015);
    expect(parseIpv4("255.255.255.255")).toBe(0xffffffff);
    for (const bad of ["1.2.3", "1.2.3.4.5", "256.1.1.1", "01.2.3.4", "a.b.c.d", "", "1..2.3", " 1.2.3.4"]) {
      expect(parseIpv4(bad)).toBeNull();
    }
    expect(formatCidr(parseCidr("10.1.2.3/8")!)).toBe("10.0.0.0/8");
    expect(formatCidr(parseCidr("8.8.8.8")!)).toBe("8.8.8.8/32");
    expect(formatCidr(parseCidr("0.0.0.0/0")!)).toBe("0.0.0.0/0");
    for (const bad of ["10.0.0.0/33", "10.0.0.0/", "10.0.0.0/08", "10.0.0.0/-1", "10.0.0/8"]) expect(parseCidr(bad)).toBeNull();
  });
  test("containment and overlap", () => {
    const a = parseCidr("169.254.0.0/16")!;
    expect(cidrContains(a, parseIpv4("169.254.200.3")!)).toBe(true);
    expect(cidrContains(a, parseIpv4("169.255.0.0")!)).toBe(false);
    expect(cidrsOverlap(parseCidr("169.254.0.20/30")!, parseCidr("169.254.0.0/24")!)).toBe(true);
    expect(cidrsOverlap(parseCidr("169.254.64.0/24")!, parseCidr("169.254.128.0/24")!)).toBe(false);
  });
});

describe("domain patterns", () => {
  test("exact and wildcard matching", () => {
    const w = parseDomainPattern("*.Example.COM.")!;
    expect(w).toEqual({ name: "example.com", wildcard: true });
    expect(domainMatches(w, "api.example.com")).toBe(true);
    expect(domainMatches(w, "a.b.example.com.")).toBe(true);
    expect(domainMatches(w, "example.com")).toBe(false);
    expect(domainMatches(w, "badexample.com")).toBe(false);
    const e = parseDomainPattern("example.com")!;
    expect(domainMatches(e, "EXAMPLE.com")).toBe(true);
    expect(domainMatches(e, "www.example.com")).toBe(false);
  });
  test("malformed patterns are rejected", () => {
    for (const bad of ["*", "*.", "a.*.com", "*example.com", "-a.com", "a-.com", "com", "a..com", "x".repeat(64) + ".com", "1.2.3.400", "ex ample.com"]) {
      expect(parseDomainPattern(bad)).toBeNull();
    }
  });
});

describe("parseEgressPolicy", () => {
  test("accepts CIDRs, IPs and domains; allow_internet_access false is honoured", () => {
    const p = parseEgressPolicy({
      allowOut: ["8.8.8.8", "10.1.0.0/16", "*.example.com", "pypi.org"],
      denyOut: ["0.0.0.0/0", "1.1.1.1"],
      allow_internet_access: false,
      allowPublicTraffic: true,
    });
    expect(policyToJson(p)).toEqual({
      allowOut: ["8.8.8.8/32", "10.1.0.0/16", "*.example.com", "pypi.org"],
      denyOut: ["0.0.0.0/0", "1.1.1.1/32"],
      allow_internet_access: false,
    });
    expect(parseEgressPolicy({ allowInternetAccess: false }).allowInternetAccess).toBe(false);
    expect(parseEgressPolicy(undefined)).toEqual({ allowCidrs: [], allowDomains: [], denyCidrs: [], allowInternetAccess: true, rules: [], egressProxy: null });
    expect(parseEgressPolicy({}).allowInternetAccess).toBe(true);
  });

  test("errors name the field, index and entry", () => {
    let e = policyError({ allowOut: ["8.8.8.8", "10.0.0.300"] });
    expect(e.code).toBe("net.bad_policy");
    expect(e.details).toEqual({ field: "allowOut", index: 1, entry: "10.0.0.300" });
    expect(e.message).toContain('allowOut[1] "10.0.0.300"');

    e = policyError({ allowOut: ["ex*ample.com"] });
    expect(e.details).toEqual({ field: "allowOut", index: 0, entry: "ex*ample.com" });
    e = policyError({ denyOut: ["1.2.3.4", "*.example.com"] });
    expect(e.details).toEqual({ field: "denyOut", index: 1, entry: "*.example.com" });
    expect(e.message).toContain("domain names are not supported");
    e = policyError({ denyOut: ["10.0.0.0/40"] });
    expect(e.details.entry).toBe("10.0.0.0/40");
    e = policyError({ allowOut: ["2001:db8::/32"] });
    expect(e.message).toContain("IPv6");
    e = policyError({ allowOut: "8.8.8.8" });
    expect(e.details.field).toBe("allowOut");
    e = policyError({ allowOut: [42] });
    expect(e.details).toEqual({ field: "allowOut", index: 0, entry: 42 });
    e = policyError({ allow_internet_access: "no" });
    expect(e.details.field).toBe("allow_internet_access");
    e = policyError([1]);
    expect(e.details.field).toBe("network");
    e = policyError({ allowOut: Array(1025).fill("1.1.1.1") });
    expect(e.message).toContain("more than 1024");
  });
});

describe("parseCreateNetwork", () => {
  test("top-level allow_internet_access false is honoured alongside network.allowOut", () => {
    const p = parseCreateNetwork({ templateID: "base", allow_internet_access: false, network: { allowOut: ["1.1.1.1"], allowPublicTraffic: false } });
    expect(policyToJson(p)).toEqual({ allowOut: ["1.1.1.1/32"], denyOut: [], allow_internet_access: false });
    expect(parseCreateNetwork({ templateID: "base" }).allowInternetAccess).toBe(true);
    expect(parseCreateNetwork({ network: { allow_internet_access: false } }).allowInternetAccess).toBe(false);
    expect(parseCreateNetwork({ allow_internet_access: true, network: {} }).allowInternetAccess).toBe(true);
  });
  test("bad input names the entry", () => {
    for (const [body, field] of [
      [{ allow_internet_access: 1 }, "allow_internet_access"],
      [{ network: "open" }, "network"],
      [{ network: { denyOut: ["example.com"] } }, "denyOut"],
      ["x", "body"],
    ] as const) {
      try {
        parseCreateNetwork(body);
        throw new Error("no error");
      } catch (e) {
        expect((e as NetError).code).toBe("net.bad_policy");
        expect((e as NetError).details.field).toBe(field);
      }
    }
  });
});
