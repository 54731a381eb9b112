/**
 * Restart: the node (agentenv server, real VMs, network slots, SQLite) is SIGKILLed with one
 * running and one paused sandbox; the next start reaps the orphaned VMM, its slot namespace,
 * disk and the memory image it mapped, keeps the paused sandbox (its pause snapshot), and the API
 * shows exactly that. A node SIGKILLed while it captures a pause and a snapshot, or during a fork
 * (while its checkpoint is committed, then while its children start), loses no committed snapshot
 * and leaves nothing (VMM, mount, staging commit, layer no manifest names) the next start does
 * not reap.
 */
import { afterAll, expect, test } from "bun:test";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { Database } from "bun:sqlite";
import { diskDaemonsUnder, NodeWorld, qemuPidsUnder, vmPrerequisites } from "./world.ts";
import { alive, exited } from "../helpers/proc.ts";
import { waitFor } from "../helpers/wait.ts";

const missing = vmPrerequisites();
let world: NodeWorld | undefined;

afterAll(async () => {
  await world?.dispose();
}, 60_000);

/** Layer files of the repository under `home` that no manifest (tombstoned ones too) names. */
function unnamedLayers(home: string): string[] {
  const named = new Set<string>();
  const dir = join(home, "snapshots", "manifests");
  for (const f of readdirSync(dir).filter((f) => f.endsWith(".json"))) {
    const m = JSON.parse(readFileSync(join(dir, f), "utf8"));
    for (const l of [...m.disk.layers, ...(m.memory?.layers ?? []), ...(m.vmState ? [m.vmState] : []), ...(m.tools ? [m.tools] : [])]) named.add(l.digest.slice(7));
  }
  return readdirSync(join(home, "snapshots", "layers")).filter((f) => !named.has(f));
}

/** Kinds of the committed manifests under `home`. */
function manifestKinds(home: string): string[] {
  const dir = join(home, "snapshots", "manifests");
  return readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .map((f) => JSON.parse(readFileSync(join(dir, f), "utf8")).kind as string);
}

/** FUSE disk mounts under `dir`. */
function diskMounts(dir: string): string[] {
  return readFileSync("/proc/self/mountinfo", "utf8").split("\n").filter((l) => l.includes(" fuse.aenvdisk ") && l.includes(dir));
}


test("a crashed node's running sandbox is reaped at the next start; its paused sandbox survives", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  world = new NodeWorld();
  await world.start();
  const p1 = await world.client("restart-phase1.ts");
  expect(p1.paused).toBe(true);
  expect(p1.states.sort()).toEqual([[p1.a, "running"], [p1.b, "paused"]].sort());

  await world.crash();
  // the crash left A's VMM and its slot behind
  const db = new Database(join(world.home, "agentenv.db"), { readonly: true });
  const rows = db.query<{ id: string; state: string; runtime_state: string }, []>("SELECT id, state, runtime_state FROM sandboxes").all();
  db.close();
  const a = rows.find((r) => r.id === p1.a)!;
  expect(a.state).toBe("running");
  const pausedSnap = JSON.parse(rows.find((r) => r.id === p1.b)!.runtime_state).paused as string;
  const manifest = join(world.home, "snapshots", "manifests", `${pausedSnap}.json`);
  expect(JSON.parse(readFileSync(manifest, "utf8"))).toMatchObject({ kind: "pause", source: { sandboxId: p1.b } });
  const pidA = JSON.parse(a.runtime_state).vmmPid as number;
  expect(alive(pidA)).toBe(true);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([pidA]);
  const slotsBefore = world.slotNamespaces();
  expect(slotsBefore.length).toBeGreaterThan(0);
  // mark each namespace of the crashed run: a reaped and rebuilt slot of the same name lacks the mark
  // (the mark: a per-namespace sysctl off its default of 64)
  const marked = (n: string) => Bun.spawnSync(["ip", "netns", "exec", n, "cat", "/proc/sys/net/ipv4/ip_default_ttl"]).stdout.toString().trim() === "77";
  for (const n of slotsBefore) {
    expect(Bun.spawnSync(["ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_default_ttl=77"]).exitCode).toBe(0);
    expect(marked(n)).toBe(true);
  }
  expect(existsSync(join(world.home, "sandboxes", p1.a))).toBe(true);
  // A's root disk and the memory image it maps (the template snapshot's, a shared device) are
  // still served by the crashed node's disk daemon; paused B's disk is not
  const daemons = diskDaemonsUnder(world.home);
  expect(daemons.length).toBe(1);
  expect(diskMounts(world.home).filter((l) => l.includes(`/sandboxes/${p1.a}/`)).length).toBe(1);
  expect(diskMounts(world.home).filter((l) => l.includes(`/sandboxes/${p1.b}/`))).toEqual([]);
  expect(diskMounts(world.home).filter((l) => l.includes("/shared/mem-")).length).toBe(1);

  await world.start();
  // every slot namespace of the crashed run was deleted (a name may be reused by the new warm pool)
  expect(world.slotNamespaces().filter(marked)).toEqual([]);
  // the old daemon was shut down (with its mounts); the new node runs its own. It and A's VMM
  // were not the new node's children: each may still be a zombie until init reaps it
  expect(exited(daemons[0]!)).toBe(true);
  expect(diskDaemonsUnder(world.home).length).toBe(1);
  expect(diskMounts(world.home).filter((l) => l.includes("/sandboxes/") || l.includes("/shared/mem-"))).toEqual([]);
  expect(exited(pidA)).toBe(true);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  expect(existsSync(join(world.home, "sandboxes", p1.a))).toBe(false);
  // a paused sandbox is its snapshot: no work dir, the manifest kept
  expect(existsSync(join(world.home, "sandboxes", p1.b))).toBe(false);
  expect(existsSync(manifest)).toBe(true);

  const p2 = await world.client("restart-phase2.ts", [p1.a, p1.b]);
  expect(p2.listed).toEqual([[p1.b, "paused"]]);
  expect(p2.aInfo).toBe("SandboxNotFoundError");
  expect(p2.killA).toBe(false);
  expect(p2.kept).toBe("survives a node crash");
  expect(p2.run).toBe("resumed\n");
  expect(p2.listedAfterResume).toEqual([[p1.b, "running"]]);
  expect(p2.killB).toBe(true);
  expect(p2.listedEnd).toEqual([]);
  expect(existsSync(manifest)).toBe(false);

  expect(await world.stop()).toBe(0);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  // a clean stop ends the disk daemon and every mount of it
  expect(diskDaemonsUnder(world.home)).toEqual([]);
  expect(diskMounts(world.home)).toEqual([]);
  // a clean stop removes every slot of this node
  expect(world.slotNamespaces()).toEqual([]);
}, 400_000);

test("graceful stop with shutdown_action = pause: running sandboxes are paused and resume after the restart", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  await world?.dispose();
  world = new NodeWorld();
  await world.start({ AENV__orchestrator__shutdown_action: "pause", AENV_LOG_LEVEL: "info" });
  const { id } = await world.client("shutdown-phase1.ts");
  expect(await world.stop()).toBe(0);
  // one summary line for the shutdown
  const lines = () => world!.log.split("\n").filter((l) => l.includes('"msg":"shutdown: '));
  // stderr drains after exit
  const summary = await waitFor("the shutdown summary line", () => lines().length > 0 && lines(), { timeoutMs: 2000 });
  expect(summary).toHaveLength(1);
  expect(JSON.parse(summary[0]!)).toMatchObject({ killed: 0, paused: 1, failed: 0, msg: "shutdown: killed 0, paused 1 sandboxes" });
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  expect(world.slotNamespaces()).toEqual([]);
  // the paused sandbox is a pause snapshot in the repository
  const dir = join(world.home, "snapshots", "manifests");
  const pauses = readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .map((f) => JSON.parse(readFileSync(join(dir, f), "utf8")))
    .filter((m) => m.kind === "pause" && m.source.sandboxId === id);
  expect(pauses.length).toBe(1);
  await world.start();
  const o = await world.client("shutdown-phase2.ts", [id]);
  expect(o).toEqual({ listed: [[id, "paused"]], file: "paused at shutdown", killed: true });
}, 400_000);

test("kill -9 of the node during a pause and a snapshot: committed snapshots kept, nothing leaked after the restart", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  await world?.dispose();
  world = new NodeWorld();
  await world.start();
  const s = await world.client("crash-capture.ts", ["setup"]);
  const committed = join(world.home, "snapshots", "manifests", `${s.committed}.json`);
  expect(existsSync(committed)).toBe(true);
  const c = await world.client("crash-capture.ts", ["crash", String(world.node!.pid), s.a, s.b]);
  // the node died with a commit in progress
  expect(c.stagingAtKill).toBeGreaterThan(0);
  await world.crash();
  await world.start();
  // the next start reaped the VMMs, the mounts and the half-written commits; the committed snapshot stays
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  expect(diskMounts(world.home).filter((l) => l.includes("/sandboxes/") || l.includes("/shared/mem-"))).toEqual([]);
  expect(readdirSync(join(world.home, "snapshots", "staging"))).toEqual([]);
  expect(unnamedLayers(world.home)).toEqual([]);
  expect(readdirSync(join(world.home, "sandboxes"))).toEqual([]);
  expect(existsSync(committed)).toBe(true);
  // no pause snapshot left for a sandbox that is not paused
  const dir = join(world.home, "snapshots", "manifests");
  const kinds = readdirSync(dir).map((f) => JSON.parse(readFileSync(join(dir, f), "utf8"))).filter((m) => m.kind === "pause");
  const a = await world.client("crash-capture.ts", ["after", s.committed]);
  expect(kinds.map((m) => m.source.sandboxId).every((id: string) => a.listed.some((l: string[]) => l[0] === id && l[1] === "paused"))).toBe(true);
  // sandboxes caught mid-capture are gone (their state was unknown), never listed running without a VM
  expect(a.listed.filter((l: string[]) => l[1] === "running")).toEqual([]);
  expect(a.snapshots).toContain(s.committed);
  expect(a.fromCommitted).toBe("committed before the crash");
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
}, 400_000);

test("kill -9 of the node during a fork, while its checkpoint is committed and then while its children start: committed snapshots kept; no VMM, mount, staging, work dir, fork checkpoint or unnamed layer after the restart", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  await world?.dispose();
  world = new NodeWorld();
  await world.start();
  const w = world;
  const s = await w.client("crash-fork.ts", ["setup"]);
  const committed = join(w.home, "snapshots", "manifests", `${s.committed}.json`);
  expect(existsSync(committed)).toBe(true);
  const clean = () => {
    expect(qemuPidsUnder(w.home, w.memDir)).toEqual([]);
    expect(diskMounts(w.home).filter((l) => l.includes("/sandboxes/") || l.includes("/shared/mem-"))).toEqual([]);
    expect(readdirSync(join(w.home, "snapshots", "staging"))).toEqual([]);
    expect(readdirSync(join(w.home, "sandboxes"))).toEqual([]);
    expect(unnamedLayers(w.home)).toEqual([]);
    expect(manifestKinds(w.home).filter((k) => k === "fork" || k === "pause")).toEqual([]);
    expect(existsSync(committed)).toBe(true);
  };

  // 1: killed while the checkpoint's commit has linked layers but not published its manifest
  const c1 = await w.client("crash-fork.ts", ["crash", String(w.node!.pid), s.p, "checkpoint"]);
  expect(c1.newLayers).toBeGreaterThan(0);
  expect(c1.staging).toBeGreaterThan(0);
  expect(c1.forkManifests).toBe(0);
  await w.crash();
  // the dead commit left layers no manifest names (seconds old: well inside gc_grace_secs)
  expect(unnamedLayers(w.home).length).toBeGreaterThan(0);
  expect(readdirSync(join(w.home, "snapshots", "staging")).length).toBeGreaterThan(0);
  await w.start();
  clean();

  // 2: a parent made from the committed snapshot; killed once the checkpoint is committed and
  // its children are starting
  const p2 = await w.client("crash-fork.ts", ["parent", s.committed]);
  expect(p2.file).toBe("committed before the crash");
  const c2 = await w.client("crash-fork.ts", ["crash", String(w.node!.pid), p2.p, "children"]);
  expect(c2.forkManifests).toBe(1);
  expect(c2.childDirs).toBeGreaterThan(0);
  await w.crash();
  expect(manifestKinds(w.home).filter((k) => k === "fork").length).toBe(1);
  await w.start();
  clean();

  // nothing that ran is listed (the parents and children died with the node); the committed
  // snapshot is listed and restores
  const a = await w.client("crash-fork.ts", ["after", s.committed]);
  expect(a.listed).toEqual([]);
  expect(a.snapshots).toEqual([s.committed]);
  expect(a.fromCommitted).toBe("committed before the crash");
  expect(qemuPidsUnder(w.home, w.memDir)).toEqual([]);
  expect(unnamedLayers(w.home)).toEqual([]);
}, 600_000);
