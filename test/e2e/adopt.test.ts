/**
 * Sandboxes outlive the node (issue 27), end to end: the real node (`agentenv server` in a
 * namespace of its own, real QEMU VMs, network slots, the disk daemon, SQLite) driven by the
 * unmodified e2b SDK. The node is SIGKILLed, then (the same sandboxes) stopped by SIGTERM with
 * `shutdown_action = "detach"`, while its sandboxes run, one of them streaming a command's
 * output to a client, one limited to one egress destination; each next node adopts them: the
 * same VMM processes, disk daemon and slot namespaces, the same ids answering with their files,
 * a background counter that counted on, the egress rules still enforced (traffic only inside the
 * test's namespaces), and
 * `commands.connect` reattaching to the command whose stream the stop cut. Nothing is leaked at
 * the end: processes, namespaces, mounts, work dirs, staging, layers. (A VMM killed while no node
 * runs, and kill -9 mid-create, mid-pause, mid-snapshot, mid-fork: test/e2e/restart.test.ts.)
 */
import { afterAll, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { alive } from "../helpers/proc.ts";
import { waitFor } from "../helpers/wait.ts";
import { diskDaemonsUnder, logLines, NodeWorld, qemuPidsUnder, vmPrerequisites } from "./world.ts";

const missing = vmPrerequisites();
let world: NodeWorld | undefined;

afterAll(async () => {
  await world?.dispose();
}, 60_000);

/** FUSE disk mounts under `dir`. */
function diskMounts(dir: string): string[] {
  return readFileSync("/proc/self/mountinfo", "utf8").split("\n").filter((l) => l.includes(" fuse.aenvdisk ") && l.includes(dir));
}

/** Layer files of the repository under `home` that no manifest names. */
function unnamedLayers(home: string): string[] {
  const named = new Set<string>();
  const dir = join(home, "snapshots", "manifests");
  for (const f of readdirSync(dir).filter((f) => f.endsWith(".json"))) {
    const m = JSON.parse(readFileSync(join(dir, f), "utf8"));
    for (const l of [...m.disk.layers, ...(m.memory?.layers ?? []), ...(m.vmState ? [m.vmState] : []), ...(m.tools ? [m.tools] : [])]) named.add(l.digest.slice(7));
  }
  return readdirSync(join(home, "snapshots", "layers")).filter((f) => !named.has(f));
}

/** After a clean stop with every sandbox killed: nothing of them is left anywhere. */
function expectNothingLeaked(w: NodeWorld): void {
  expect(qemuPidsUnder(w.home, w.memDir)).toEqual([]);
  expect(diskDaemonsUnder(w.home)).toEqual([]);
  expect(diskMounts(w.home)).toEqual([]);
  expect(w.slotNamespaces()).toEqual([]);
  expect(readdirSync(join(w.home, "sandboxes"))).toEqual([]);
  expect(readdirSync(join(w.home, "snapshots", "staging"))).toEqual([]);
  expect(unnamedLayers(w.home)).toEqual([]);
  expect(readdirSync(join(w.home, "run", "vmm")).filter((f) => f.endsWith(".json"))).toEqual([]);
}

/** Mark each slot namespace (a sysctl off its default): a slot reaped and rebuilt under the same name lacks it. */
function markSlots(w: NodeWorld): (n: string) => boolean {
  for (const n of w.slotNamespaces()) expect(Bun.spawnSync(["ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_default_ttl=77"]).exitCode).toBe(0);
  return (n) => Bun.spawnSync(["ip", "netns", "exec", n, "cat", "/proc/sys/net/ipv4/ip_default_ttl"]).stdout.toString().trim() === "77";
}

/** The slot namespaces of sandboxes `ids`, by the slot their stored runtime state names (`held.slot`). */
function sandboxSlots(w: NodeWorld, ids: string[]): string[] {
  const db = new Database(join(w.home, "agentenv.db"), { readonly: true });
  try {
    return ids.map((id) => {
      const row = db.query<{ runtime_state: string }, [string]>("SELECT runtime_state FROM sandboxes WHERE id = ?").get(id)!;
      return `${w.prefix}${JSON.parse(row.runtime_state).held.slot}`;
    });
  } finally {
    db.close();
  }
}

/**
 * Set up two sandboxes and a client streaming a command of the second; returns what setup saw
 * and the stream's first report.
 */
async function setUp(w: NodeWorld) {
  const s = await w.client("adopt.ts", ["setup"]);
  expect(s.allowed).toBe("hello 169.254.200.2:8080");
  expect(s.denied).not.toContain("hello");
  const stream = w.spawnClient("adopt.ts", ["stream", s.b]);
  const first = JSON.parse((await stream.lines.next()).value as string) as { pid: number; last: number };
  expect(first.last).toBeGreaterThanOrEqual(3);
  return { s, stream, first };
}

/** What the restarted node serves of the sandboxes `setUp` made. */
async function expectContinued(w: NodeWorld, s: any, streamPid: number, lastSeen: number): Promise<void> {
  const c = await w.client("adopt.ts", ["check", s.a, s.b, String(s.counterPid), String(streamPid), String(s.counter)]);
  expect(c.file).toBe("written before the crash");
  expect(c.tmp).toBe("in /tmp before the crash");
  // the counter counted on: past its value before, and on from there
  expect(c.counterAfter).toBeGreaterThan(c.counterBefore);
  expect(c.counterLater).toBeGreaterThan(c.counterAfter);
  expect(c.counterAlive).toBe(true);
  expect(c.allowed).toBe("hello 169.254.200.2:8080");
  expect(c.denied).not.toContain("hello");
  // the command whose stream was cut ran on; connect streams its further output
  expect(c.streamAlive).toBe(true);
  expect(c.reattachedFirst).toBeGreaterThan(lastSeen);
  expect(c.reattachedLast).toBeGreaterThanOrEqual(c.reattachedFirst + 3);
}

test("kill -9 of the node, then a SIGTERM with shutdown_action = detach: each next node adopts the running sandboxes (same VMMs, disks, slots), files, counters, egress rules and command streams go on; nothing leaked", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  world = new NodeWorld();
  const w = world;
  await w.inet();
  await w.start({ AENV_LOG_LEVEL: "info" });
  const { s, stream, first } = await setUp(w);
  const vmms = qemuPidsUnder(w.home, w.memDir).sort();
  expect(vmms.length).toBe(2);
  const daemons = diskDaemonsUnder(w.home);
  expect(daemons.length).toBe(1);
  const marked = markSlots(w);
  const slots = sandboxSlots(w, [s.a, s.b]);
  expect(slots.every(marked)).toBe(true);

  await w.crash();
  // the client's stream ended with the node; the command did not
  const ended = JSON.parse((await stream.lines.next()).value as string) as { last: number; ended: string };
  expect(ended.ended).not.toBe("exited");
  await stream.proc.exited;
  expect(vmms.every(alive)).toBe(true);
  expect(alive(daemons[0]!)).toBe(true);

  // this node is stopped by SIGTERM below: it leaves the sandboxes running (the upgrade path)
  const detach = { AENV_LOG_LEVEL: "info", AENV__orchestrator__shutdown_action: "detach" };
  await w.start(detach);
  const done = logLines(w, "start-up reconciliation done");
  expect(done).toHaveLength(1);
  expect(done[0]).toMatchObject({ adopted: 2, pausedWithFiles: 0, killed: 0 });
  expect(logLines(w, "sandbox adopted").map((l) => l.sandboxId).sort()).toEqual([s.a, s.b].sort());
  // the same processes and namespaces: adopted, not reaped and made again
  expect(qemuPidsUnder(w.home, w.memDir).sort()).toEqual(vmms);
  expect(diskDaemonsUnder(w.home)).toEqual(daemons);
  expect(sandboxSlots(w, [s.a, s.b])).toEqual(slots);
  expect(slots.filter(marked)).toEqual(slots);
  await expectContinued(w, s, first.pid, ended.last);

  // the upgrade path: the node (shutdown_action = detach) stopped by SIGTERM while a client
  // streams a command again leaves the same sandboxes running for the next one
  const again = w.spawnClient("adopt.ts", ["stream", s.b]);
  const second = JSON.parse((await again.lines.next()).value as string) as { pid: number; last: number };
  expect(second.pid).not.toBe(first.pid);
  expect(await w.stop()).toBe(0);
  // stderr drains after exit
  const shutdownLines = () => logLines(w, "shutdown: killed 0, paused 0 sandboxes, left 2 running for the next start");
  const summary = await waitFor("the shutdown summary line", () => shutdownLines().length > 0 && shutdownLines(), { timeoutMs: 2000 });
  expect(summary).toHaveLength(1);
  expect(summary[0]).toMatchObject({ killed: 0, paused: 0, detached: 2, failed: 0 });
  const cut = JSON.parse((await again.lines.next()).value as string) as { last: number; ended: string };
  expect(cut.ended).not.toBe("exited");
  await again.proc.exited;
  expect(qemuPidsUnder(w.home, w.memDir).sort()).toEqual(vmms);
  expect(diskDaemonsUnder(w.home)).toEqual(daemons);
  expect(slots.filter(marked)).toEqual(slots);

  await w.start({ AENV_LOG_LEVEL: "info" });
  expect(logLines(w, "start-up reconciliation done")[0]).toMatchObject({ adopted: 2, pausedWithFiles: 0, killed: 0 });
  expect(qemuPidsUnder(w.home, w.memDir).sort()).toEqual(vmms);
  expect(diskDaemonsUnder(w.home)).toEqual(daemons);
  expect(sandboxSlots(w, [s.a, s.b])).toEqual(slots);
  expect(slots.filter(marked)).toEqual(slots);
  await expectContinued(w, s, second.pid, cut.last);

  await w.client("adopt.ts", ["kill", s.a, s.b]);
  expect(await w.stop()).toBe(0);
  expectNothingLeaked(w);
}, 600_000);
