import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { type Agent, sh, World } from "./harness.ts";
import { waitFor } from "../helpers/wait.ts";

// Real namespaces, veths, taps and iptables; a NetworkManager process in a test-made netns.
// a missing prerequisite fails the file, it does not skip it
if (process.getuid?.() !== 0) throw new Error("these tests make network namespaces and iptables rules: run them as root");

describe("slot isolation and egress policy (real netns)", () => {
  let w: World;
  let agent: Agent;

  beforeAll(async () => {
    w = new World();
    await w.servers({
      tcp: [
        ["169.254.200.2", 8080],
        ["169.254.200.3", 8080],
      ],
      dns: { ip: "169.254.200.2", port: 53, names: { "api.allowed.test": "169.254.200.2", "x.blocked.test": "169.254.200.3", "short.allowed.test": "169.254.200.3@1" } },
    });
    const a = await w.agent();
    expect(a.start.error).toBeUndefined();
    agent = a.agent;
  }, 60_000);

  afterAll(async () => {
    await agent?.call("shutdown");
    await w?.cleanup();
  }, 60_000);

  test("allowed vs denied test server; allow wins over deny; runtime replacement", async () => {
    const s = await agent.ok("allocate", { sandboxId: "sb-a", policy: { allowOut: ["169.254.200.2"], denyOut: ["169.254.200.0/24"] } });
    const g = w.attachGuest(s);
    expect(w.tcp(g, "169.254.200.2", 8080)).toEqual({ ok: true, data: "hello 169.254.200.2:8080\n" });
    const denied = w.tcp(g, "169.254.200.3", 8080);
    expect(denied.ok).toBe(false);

    await agent.ok("update", { sandboxId: "sb-a", policy: { allowOut: ["169.254.200.3/32"] } });
    expect(w.tcp(g, "169.254.200.3", 8080)).toEqual({ ok: true, data: "hello 169.254.200.3:8080\n" });
    expect(w.tcp(g, "169.254.200.2", 8080).ok).toBe(false);

    // allow_internet_access: false with default "allow" would still deny; here the allow entry wins.
    await agent.ok("update", { sandboxId: "sb-a", policy: { allowOut: ["169.254.200.2"], allow_internet_access: false } });
    expect(w.tcp(g, "169.254.200.2", 8080).ok).toBe(true);
    expect(w.tcp(g, "169.254.200.3", 8080).ok).toBe(false);

    const bad = await agent.call("update", { sandboxId: "sb-a", policy: { allowOut: ["169.254.200.2", "300.1.1.1/8"] } });
    expect(bad.ok).toBe(false);
    expect(bad.error!.code).toBe("net.bad_policy");
    expect(bad.error!.details).toEqual({ field: "allowOut", index: 1, entry: "300.1.1.1/8" });
    // the failed update changed nothing
    expect(w.tcp(g, "169.254.200.2", 8080).ok).toBe(true);

    const unknown = await agent.call("update", { sandboxId: "nope", policy: {} });
    expect(unknown.error!.code).toBe("net.unknown_slot");
    await agent.ok("release", { sandboxId: "sb-a" });
  }, 60_000);

  test("the node reaches guest ports through the slot; two slots cannot reach each other", async () => {
    const a = await agent.ok("allocate", { sandboxId: "sb-1", policy: { allowOut: ["169.254.0.0/16"] } });
    const b = await agent.ok("allocate", { sandboxId: "sb-2", policy: { allowOut: ["169.254.0.0/16"] } });
    expect(a.idx).not.toBe(b.idx);
    const ga = w.attachGuest(a);
    const gb = w.attachGuest(b);
    await w.servers({ tcp: [["169.254.0.21", 7000]] }, gb);
    await w.servers({ tcp: [["169.254.0.21", 7000]] }, ga);
    // inbound: node → hostIp:port → DNAT → guest
    expect(w.tcp(w.nodeNs, b.hostIp, 7000)).toEqual({ ok: true, data: "hello 169.254.0.21:7000\n" });
    expect(w.tcp(w.nodeNs, a.hostIp, 7000).ok).toBe(true);
    // slot a has a policy that allows all of 169.254/16 and still cannot reach slot b
    expect(w.tcp(ga, "169.254.200.2", 8080).ok).toBe(true);
    expect(w.tcp(ga, b.hostIp, 7000, 700).ok).toBe(false);
    expect(w.tcp(ga, b.nsVethIp, 7000, 700).ok).toBe(false);
    expect(w.tcp(gb, a.hostIp, 7000, 700).ok).toBe(false);
    // (dropped, not refused: 700 ms without an answer is the verdict)
    // nor the node itself (only DNS proxy and replies are accepted from slots)
    await w.servers({ tcp: [["169.254.200.1", 9000]] }, w.nodeNs);
    expect(w.tcp(w.nodeNs, "169.254.200.1", 9000).ok).toBe(true);
    expect(w.tcp(ga, "169.254.200.1", 9000, 700).ok).toBe(false);
    await agent.ok("release", { sandboxId: "sb-1" });
    await agent.ok("release", { sandboxId: "sb-2" });
  }, 60_000);

  test("domain rules: only addresses DNS returned for an allowed pattern open", async () => {
    const s = await agent.ok("allocate", { sandboxId: "sb-d", policy: { allowOut: ["*.allowed.test"] } });
    const g = w.attachGuest(s);
    expect(w.tcp(g, "169.254.200.2", 8080).ok).toBe(false); // not resolved yet
    // the guest asks any server on port 53; the slot sends it to the node's proxy
    expect(w.dns(g, "169.254.0.22", "api.allowed.test")).toEqual({ ok: true, rcode: 0, addrs: ["169.254.200.2"] });
    expect(await agent.ok("dnsAllowed", { sandboxId: "sb-d" })).toEqual(["169.254.200.2"]);
    expect(w.tcp(g, "169.254.200.2", 8080)).toEqual({ ok: true, data: "hello 169.254.200.2:8080\n" });
    // DNS over TCP is redirected too (whatever server the guest names)
    expect(w.dnsTcp(g, "9.9.9.9", "api.allowed.test")).toEqual({ ok: true, rcode: 0, addrs: ["169.254.200.2"] });
    // a name outside the pattern resolves but its address stays closed
    expect(w.dns(g, "8.8.8.8", "x.blocked.test")).toEqual({ ok: true, rcode: 0, addrs: ["169.254.200.3"] });
    expect(w.tcp(g, "169.254.200.3", 8080).ok).toBe(false);
    expect(w.dns(g, "169.254.0.22", "missing.allowed.test")).toEqual({ ok: true, rcode: 3, addrs: [] });
    // the proxy is not an open resolver: from outside the slots its port is silent
    const port = await agent.ok("dnsPort");
    expect(port).toBeGreaterThan(0);
    expect(w.dns(w.inetNs, `169.254.200.1:${port}`, "api.allowed.test", 700)).toEqual({ ok: false, error: "timeout" });
    // replacing the policy drops learned addresses that no longer match
    await agent.ok("update", { sandboxId: "sb-d", policy: { allowOut: ["*.other.test"] } });
    expect(await agent.ok("dnsAllowed", { sandboxId: "sb-d" })).toEqual([]);
    expect(w.tcp(g, "169.254.200.2", 8080).ok).toBe(false);
    // a learned address closes again when its TTL (1 s here, floor 0) runs out
    await agent.ok("update", { sandboxId: "sb-d", policy: { allowOut: ["*.allowed.test"] } });
    expect(w.dns(g, "169.254.0.22", "short.allowed.test").addrs).toEqual(["169.254.200.3"]);
    expect(w.tcp(g, "169.254.200.3", 8080).ok).toBe(true);
    // closed by the expiry timer when the TTL runs out
    await waitFor("the learned address to close", async () => (await agent.ok("dnsAllowed", { sandboxId: "sb-d" })).length === 0 && !w.tcp(g, "169.254.200.3", 8080, 700).ok, { timeoutMs: 10_000 });
    await agent.ok("release", { sandboxId: "sb-d" });
  }, 60_000);

  test("a guest cannot forge another slot's source to open that slot's firewall", async () => {
    const a = await agent.ok("allocate", { sandboxId: "sp-a", policy: { allowOut: ["*.allowed.test"] } });
    const b = await agent.ok("allocate", { sandboxId: "sp-b", policy: { allowOut: ["*.allowed.test"] } });
    const ga = w.attachGuest(a);
    w.attachGuest(b);
    sh(["ip", "-n", ga, "addr", "add", `${b.nsVethIp}/32`, "dev", "eth0"]);
    expect(w.dns(ga, "169.254.0.22", "api.allowed.test", 800, b.nsVethIp)).toEqual({ ok: false, error: "timeout" });
    expect(await agent.ok("dnsAllowed", { sandboxId: "sp-b" })).toEqual([]);
    expect(await agent.ok("dnsAllowed", { sandboxId: "sp-a" })).toEqual([]);
    // control: the same query from the guest's own address works and opens slot a only
    expect(w.dns(ga, "169.254.0.22", "api.allowed.test").addrs).toEqual(["169.254.200.2"]);
    expect(await agent.ok("dnsAllowed", { sandboxId: "sp-a" })).toEqual(["169.254.200.2"]);
    expect(await agent.ok("dnsAllowed", { sandboxId: "sp-b" })).toEqual([]);
    await agent.ok("release", { sandboxId: "sp-a" });
    await agent.ok("release", { sandboxId: "sp-b" });
  }, 60_000);
});
