import { afterEach, describe, expect, test } from "bun:test";
import { sh, World } from "./harness.ts";

// Real namespaces and iptables in a test-made "node" netns; NetworkManager runs in an agent process.
// a missing prerequisite fails the file, it does not skip it
if (process.getuid?.() !== 0) throw new Error("these tests make network namespaces and iptables rules: run them as root");

describe("slot life cycle (real netns)", () => {
  let w: World | undefined;
  afterEach(async () => {
    await w?.cleanup();
    w = undefined;
  }, 60_000);

  test("warm pool: start fills to low, allocate takes from it, worker refills, release returns, drains above high", async () => {
    w = new World();
    const { agent, start } = await w.agent({ network: { max_slots: 6 }, pool: { low_watermark: 2, high_watermark: 3 } });
    expect(start.error).toBeUndefined();
    expect(w.slotNetns().length).toBe(2);
    expect(await agent.ok("stats")).toMatchObject({ pooled: 2, allocated: 0, free: 4, target: 2 });
    expect(await agent.ok("rows")).toEqual([
      { idx: 0, state: "pooled", sandboxId: null },
      { idx: 1, state: "pooled", sandboxId: null },
    ]);

    const s1 = await agent.ok("allocate", { sandboxId: "s1", policy: {} });
    expect(s1.idx).toBe(0);
    expect(s1.netnsPath).toBe(`/run/netns/${w.prefix}0`);
    let st = await agent.ok("stats", { idle: true });
    expect(st).toMatchObject({ pooled: 2, allocated: 1, poolHits: 1, poolMisses: 0 });
    // the tap the VMM opens exists, up, with the gateway address
    const tap = sh(["ip", "-n", s1.netnsName, "-o", "addr", "show", "dev", "tap0"]).out;
    expect(tap).toContain("inet 169.254.0.22/30");
    expect(sh(["ip", "-n", s1.netnsName, "-d", "link", "show", "tap0"]).out).toContain("tun type tap");

    // two more at once: served from the pool (or built on demand when the refill lags)
    await Promise.all(["s2", "s3"].map((id) => agent.ok("allocate", { sandboxId: id, policy: { allowOut: ["1.1.1.1"] } })));
    st = await agent.ok("stats", { idle: true });
    expect(st.allocated).toBe(3);
    expect(st.poolHits + st.poolMisses).toBe(3);
    expect(await agent.ok("rows")).toContainEqual({ idx: 0, state: "allocated", sandboxId: "s1" });

    for (const id of ["s1", "s2", "s3"]) await agent.ok("release", { sandboxId: id });
    st = await agent.ok("stats", { idle: true });
    expect(st.allocated).toBe(0);
    expect(st.pooled).toBe(3); // drained down to the high watermark
    expect(w.slotNetns().length).toBe(3);
    expect(w.slotLinks().length).toBe(3);

    const dup = await agent.ok("allocate", { sandboxId: "d", policy: {} });
    const again = await agent.call("allocate", { sandboxId: "d", policy: {} });
    expect(again.error!.code).toBe("net.duplicate_sandbox");
    await agent.ok("release", { sandboxId: dup.sandboxId });
    const rel = await agent.call("release", { sandboxId: "d" });
    expect(rel.error!.code).toBe("net.unknown_slot");

    await agent.ok("shutdown");
    expect(w.slotNetns()).toEqual([]);
    expect(w.slotLinks()).toEqual([]);
    expect(w.ourRules()).toEqual([]);
  }, 90_000);

  test("exhaustion is a capacity error and builds nothing; a failed build is rolled back", async () => {
    w = new World();
    const { agent } = await w.agent({
      network: { max_slots: 3, egress: { dns_proxy_enabled: false } },
      pool: { low_watermark: 0, high_watermark: 1, network: { maintenance_enabled: false } },
    });
    expect(w.slotNetns()).toEqual([]);
    // without the DNS proxy a domain rule could never open: refused, nothing built
    const dom = await agent.call("allocate", { sandboxId: "dom", policy: { allowOut: ["1.2.3.4", "*.example.com"] } });
    expect(dom.error!.code).toBe("net.bad_policy");
    expect(dom.error!.details).toEqual({ field: "allowOut", entry: "*.example.com" });
    expect(w.slotNetns()).toEqual([]);

    // make slot 0's build fail at its host route: nothing of slot 0 may stay behind
    sh(["ip", "-n", w.nodeNs, "route", "add", "169.254.64.1/32", "dev", "lo"]);
    const failed = await agent.call("allocate", { sandboxId: "f", policy: {} });
    expect(failed.error!.code).toBe("net.setup_failed");
    expect(failed.error!.details.idx).toBe(0);
    expect(w.slotNetns()).toEqual([]);
    expect(w.slotLinks()).toEqual([]);
    expect(await agent.ok("rows")).toEqual([]);
    sh(["ip", "-n", w.nodeNs, "route", "del", "169.254.64.1/32", "dev", "lo"]);

    for (const id of ["a", "b", "c"]) await agent.ok("allocate", { sandboxId: id, policy: {} });
    expect(w.slotNetns().length).toBe(3);
    // no pool here: every allocation was built on demand; the refill target is capped at high
    expect(await agent.ok("stats")).toMatchObject({ pooled: 0, allocated: 3, free: 0, poolHits: 0, poolMisses: 4, target: 1 });
    const full = await agent.call("allocate", { sandboxId: "d", policy: {} });
    expect(full.error!.code).toBe("net.capacity");
    expect(full.error!.details).toEqual({ maxSlots: 3, inUse: 3 });
    expect(w.slotNetns().length).toBe(3);
    expect(w.slotLinks().length).toBe(3);
    // the sandbox id of a failed allocation is free again
    await agent.ok("release", { sandboxId: "a" });
    const d = await agent.ok("allocate", { sandboxId: "d", policy: {} });
    expect(d.idx).toBe(0);
    await agent.ok("shutdown");
    expect(w.slotNetns()).toEqual([]);
  }, 90_000);

  test("kill -9 of the node, then a fresh start, reaps every netns, veth and chain", async () => {
    w = new World();
    const first = await w.agent({ pool: { low_watermark: 2, high_watermark: 2 } });
    await first.agent.ok("allocate", { sandboxId: "x", policy: { allowOut: ["1.2.3.4"] } });
    await first.agent.ok("allocate", { sandboxId: "y", policy: {} });
    await first.agent.ok("stats", { idle: true });
    expect(w.slotNetns().length).toBe(4);
    expect(w.slotLinks().length).toBe(4);
    expect(w.ourRules().length).toBeGreaterThan(0);

    first.agent.proc.kill("SIGKILL");
    expect(await first.agent.proc.exited).not.toBe(0);
    expect(w.slotNetns().length).toBe(4); // the crash left everything behind

    const second = await w.agent({ pool: { low_watermark: 1, high_watermark: 2 } });
    expect(second.start.error).toBeUndefined();
    const report = second.start.result.report;
    expect(report.netns).toEqual([0, 1, 2, 3].map((i) => `${w!.prefix}${i}`));
    expect(report.links).toEqual([0, 1, 2, 3].map((i) => `${w!.prefix}${i}`));
    expect(report.chains).toEqual([`filter/${w.prefix}fwd`, `filter/${w.prefix}in`, `nat/${w.prefix}egr`, `nat/${w.prefix}post`]);
    // the rows the crashed run persisted tell which sandboxes held which slot
    expect(report.previous.map((r: any) => [r.idx, r.state, r.sandboxId])).toEqual([
      [0, "allocated", "x"],
      [1, "allocated", "y"],
      [2, "pooled", null],
      [3, "pooled", null],
    ]);
    expect(report.previous[0].policy).toEqual({ allowOut: ["1.2.3.4/32"], denyOut: [], allow_internet_access: true });
    // only the new pool's one slot exists, and the node rules are installed exactly once
    expect(w.slotNetns()).toEqual([`${w.prefix}0`]);
    expect(w.ourRules().filter((l) => l.startsWith("-A FORWARD") || l.startsWith("-A INPUT") || l.startsWith("-A POSTROUTING")).length).toBe(3);
    expect(await second.agent.ok("rows")).toEqual([{ idx: 0, state: "pooled", sandboxId: null }]);
    await second.agent.ok("shutdown");
    expect(w.slotNetns()).toEqual([]);
    expect(w.slotLinks()).toEqual([]);
    expect(w.ourRules()).toEqual([]);
  }, 90_000);
});
