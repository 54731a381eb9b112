import { afterAll, expect, test } from "bun:test";
import { sh, World } from "./harness.ts";

// A node keeps the network slots of sandboxes that outlive it (issue 27), against real
// namespaces, veths and iptables: a NetworkManager process (the harness's agent) allocates slots
// with egress policies and is SIGKILLed; the next one starts keeping some of them. Traffic stays
// inside the namespaces the test made (169.254.0.0/16).
if (process.getuid?.() !== 0) throw new Error("these tests make network namespaces and iptables rules: run them as root");

let w: World | undefined;
afterAll(async () => {
  await w?.cleanup();
}, 60_000);

test("kill -9 of the node; the next keeps one slot (rules, DNS-learned addresses, policy enforced), reaps the rest, reports the unkeepable; nothing leaked at shutdown", async () => {
  w = new World();
  await w.servers({
    tcp: [
      ["169.254.200.2", 8080],
      ["169.254.200.3", 8080],
    ],
    dns: { ip: "169.254.200.2", port: 53, names: { "api.allowed.test": "169.254.200.2@600" } },
  });
  const first = await w.agent();
  expect(first.start.error).toBeUndefined();
  const a = first.agent;
  const keep = await a.ok("allocate", { sandboxId: "keep", policy: { allowOut: ["*.allowed.test"] } });
  const drop = await a.ok("allocate", { sandboxId: "drop", policy: { allowOut: ["169.254.200.3"] } });
  const broken = await a.ok("allocate", { sandboxId: "broken", policy: {} });
  const gk = w.attachGuest(keep);
  const gd = w.attachGuest(drop);
  await w.servers({ tcp: [["169.254.0.21", 7000]] }, gk);
  // the kept guest learns an allowed name's address through the node's DNS proxy
  expect(w.dns(gk, "169.254.0.22", "api.allowed.test")).toEqual({ ok: true, rcode: 0, addrs: ["169.254.200.2"] });
  expect(w.tcp(gk, "169.254.200.2", 8080).ok).toBe(true);
  expect(w.tcp(gk, "169.254.200.3", 8080).ok).toBe(false);
  expect(w.tcp(gd, "169.254.200.3", 8080).ok).toBe(true);
  const oldPort = await a.ok("dnsPort");
  await a.ok("stats", { idle: true });

  a.proc.kill("SIGKILL");
  await a.proc.exited;
  // between the nodes the kept slot's rules still enforce
  expect(w.tcp(gk, "169.254.200.2", 8080).ok).toBe(true);
  expect(w.tcp(gk, "169.254.200.3", 8080).ok).toBe(false);
  // one slot made unkeepable: its tap is gone
  sh(["ip", "-n", broken.netnsName, "link", "del", "tap0"]);
  const before = w.slotNetns();
  expect(before).toContain(keep.netnsName);

  const second = await w.agent({}, [{ sandboxId: "keep" }, { sandboxId: "broken" }, { sandboxId: "ghost" }]);
  expect(second.start.error).toBeUndefined();
  const b = second.agent;
  const r = second.start.result.report;
  expect(r.adopted.map((s: { sandboxId: string; idx: number; hostIp: string }) => [s.sandboxId, s.idx, s.hostIp])).toEqual([["keep", keep.idx, keep.hostIp]]);
  expect(r.adopted[0].policy.allowDomains).toEqual([{ name: "allowed.test", wildcard: true }]);
  expect(r.lost.map((l: { sandboxId: string }) => l.sandboxId)).toEqual(["broken", "ghost"]);
  expect(r.lost[0].reason).toContain(`link tap0 in ${broken.netnsName}`);
  expect(r.lost[1].reason).toBe("no allocated slot row names it");
  expect(r.netns).not.toContain(keep.netnsName);
  expect(r.netns).toContain(drop.netnsName);
  expect(r.netns).toContain(broken.netnsName);
  expect(r.links).not.toContain(keep.hostVeth);

  // the kept slot: same namespace, DNS-learned address read back from the kernel, policy enforced
  expect(w.slotNetns()).toContain(keep.netnsName);
  expect(w.slotNetns()).not.toContain(drop.netnsName);
  expect(await b.ok("dnsAllowed", { sandboxId: "keep" })).toEqual(["169.254.200.2"]);
  expect(w.tcp(gk, "169.254.200.2", 8080)).toEqual({ ok: true, data: "hello 169.254.200.2:8080\n" });
  expect(w.tcp(gk, "169.254.200.3", 8080).ok).toBe(false);
  // its DNS goes to the new proxy (on another port: the slot's redirect was re-applied)
  expect(await b.ok("dnsPort")).not.toBe(oldPort);
  expect(w.dns(gk, "9.9.9.9", "api.allowed.test")).toEqual({ ok: true, rcode: 0, addrs: ["169.254.200.2"] });
  // the node reaches the guest's port through the slot, and a policy update applies
  expect(w.tcp(w.nodeNs, keep.hostIp, 7000)).toEqual({ ok: true, data: "hello 169.254.0.21:7000\n" });
  await b.ok("update", { sandboxId: "keep", policy: { allowOut: ["169.254.200.3"] } });
  expect(w.tcp(gk, "169.254.200.3", 8080).ok).toBe(true);
  expect(w.tcp(gk, "169.254.200.2", 8080).ok).toBe(false);
  // the kept slot's index is taken: new allocations get others; rows say who holds what
  const fresh = await b.ok("allocate", { sandboxId: "new", policy: {} });
  expect(fresh.idx).not.toBe(keep.idx);
  const rows = (await b.ok("rows")) as { idx: number; state: string; sandboxId: string | null }[];
  expect(rows.filter((x) => x.state === "allocated").map((x) => [x.idx, x.sandboxId]).sort()).toEqual([[keep.idx, "keep"], [fresh.idx, "new"]].sort());
  // the node rules exist once (replaced, not added again)
  expect(w.ourRules().filter((l) => l.startsWith("-A FORWARD") || l.startsWith("-A INPUT") || l.startsWith("-A POSTROUTING")).length).toBe(3);

  // detach (the upgrade path): slots and rules stay; the next node keeps "keep" with the policy
  // the update persisted, and "new" is reaped as nobody keeps it
  await b.ok("detach");
  await b.proc.exited;
  expect(w.tcp(gk, "169.254.200.3", 8080).ok).toBe(true);
  const third = await w.agent({}, [{ sandboxId: "keep" }]);
  expect(third.start.error).toBeUndefined();
  const r3 = third.start.result.report;
  expect(r3.adopted.map((s: { sandboxId: string; idx: number }) => [s.sandboxId, s.idx])).toEqual([["keep", keep.idx]]);
  expect(r3.netns).toContain(fresh.netnsName);
  expect(w.tcp(gk, "169.254.200.3", 8080).ok).toBe(true);
  expect(w.tcp(gk, "169.254.200.2", 8080).ok).toBe(false);
  const c = third.agent;

  await c.ok("shutdown");
  expect(w.slotNetns()).toEqual([]);
  expect(w.slotLinks()).toEqual([]);
  expect(w.ourRules()).toEqual([]);
}, 120_000);
