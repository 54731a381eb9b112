/**
 * Restart: the node (agentenv server, real VMs, network slots, SQLite) is SIGKILLed with one
 * running and one paused sandbox and the running one's VMM is killed while no node runs: the next
 * start pauses it with its disk as the VMM left it (a filesystem-only snapshot) and reaps what its
 * VM held (its slot namespace, disk export, the memory image it mapped), keeps the paused sandbox
 * (its pause snapshot) and the disk daemon (adopted), and the API shows exactly that; both come
 * back with their files at connect. A node SIGKILLed while it captures a pause and a snapshot,
 * while it creates a sandbox, or during a fork (while its checkpoint is committed, then while its
 * children start) leaves every sandbox running or paused with its files, never half made: no
 * committed snapshot is lost, nothing (VMM, mount, staging commit, layer no manifest names,
 * fork checkpoint) is left that the next start does not reap. (Sandboxes whose VM survives:
 * test/e2e/adopt.test.ts.)
 */
import { afterAll, expect, test } from "bun:test";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { Database } from "bun:sqlite";
import { diskDaemonsUnder, logLines, NodeWorld, qemuPidsUnder, vmPrerequisites } from "./world.ts";
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

/** The committed manifests under `home`. */
function manifestsOf(home: string): Record<string, any>[] {
  const dir = join(home, "snapshots", "manifests");
  return readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .map((f) => JSON.parse(readFileSync(join(dir, f), "utf8")));
}

/** Kinds of the committed manifests under `home`. */
function manifestKinds(home: string): string[] {
  return manifestsOf(home).map((m) => m.kind as string);
}

/** FUSE disk mounts under `dir`. */
function diskMounts(dir: string): string[] {
  return readFileSync("/proc/self/mountinfo", "utf8").split("\n").filter((l) => l.includes(" fuse.aenvdisk ") && l.includes(dir));
}


test("a VMM killed while no node runs: its sandbox comes back paused with its files (filesystem only) and boots on them at connect; the paused sandbox survives; what its VM held is reaped", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  world = new NodeWorld();
  // removed snapshots' layers go at once (else after the grace period): the end asserts none is left
  const noGrace = { AENV__snapshot__gc_grace_secs: "0" };
  await world.start(noGrace);
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
  // A's VMM dies while no node runs
  process.kill(pidA, "SIGKILL");
  await waitFor("A's VMM to die", () => !alive(pidA) || exited(pidA));

  await world.start({ ...noGrace, AENV_LOG_LEVEL: "info" });
  expect(logLines(world, "start-up reconciliation done")[0]).toMatchObject({ adopted: 0, pausedWithFiles: 1, killed: 0, paused: 1 });
  // every slot namespace of the crashed run was deleted (a name may be reused by the new warm pool)
  expect(world.slotNamespaces().filter(marked)).toEqual([]);
  // the daemon was adopted; the exports A's VM held are gone with it (nothing else claimed them)
  expect(diskDaemonsUnder(world.home)).toEqual(daemons);
  expect(diskMounts(world.home).filter((l) => l.includes("/sandboxes/") || l.includes("/shared/mem-"))).toEqual([]);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  // a paused sandbox is its snapshot: no work dir; A's disk is a filesystem-only pause snapshot now
  expect(existsSync(join(world.home, "sandboxes", p1.a))).toBe(false);
  expect(existsSync(join(world.home, "sandboxes", p1.b))).toBe(false);
  expect(existsSync(manifest)).toBe(true);
  const db2 = new Database(join(world.home, "agentenv.db"), { readonly: true });
  const aNow = db2.query<{ state: string; snapshot_kind: string; error: string; runtime_state: string }, [string]>("SELECT state, snapshot_kind, error, runtime_state FROM sandboxes WHERE id = ?").get(p1.a)!;
  db2.close();
  expect(aNow).toMatchObject({ state: "paused", snapshot_kind: "filesystem" });
  expect(aNow.error).toContain("its VMM was not adopted (gone)");
  const aSnap = JSON.parse(readFileSync(join(world.home, "snapshots", "manifests", `${JSON.parse(aNow.runtime_state).paused}.json`), "utf8"));
  expect(aSnap).toMatchObject({ kind: "pause", source: { sandboxId: p1.a }, memory: null, vmState: null });

  const p2 = await world.client("restart-phase2.ts", [p1.a, p1.b]);
  expect(p2.listed).toEqual([[p1.a, "paused"], [p1.b, "paused"]].sort());
  // A booted on its disk: its files, /tmp included (only a sandbox's first boot empties /tmp)
  expect(p2.aFile).toBe("written before its VMM was killed");
  expect(p2.aTmp).toBe("a\n");
  expect(p2.aRun).toBe("booted on its disk\n");
  expect(p2.kept).toBe("survives a node crash");
  expect(p2.run).toBe("resumed\n");
  expect(p2.listedAfterResume).toEqual([[p1.a, "running"], [p1.b, "running"]].sort());
  expect([p2.killA, p2.killB]).toEqual([true, true]);
  expect(p2.listedEnd).toEqual([]);
  expect(existsSync(manifest)).toBe(false);

  expect(await world.stop()).toBe(0);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  // a clean stop ends the disk daemon and every mount of it
  expect(diskDaemonsUnder(world.home)).toEqual([]);
  expect(diskMounts(world.home)).toEqual([]);
  // a clean stop removes every slot of this node
  expect(world.slotNamespaces()).toEqual([]);
  expect(unnamedLayers(world.home)).toEqual([]);
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

test("kill -9 of the node during a pause and a snapshot, then during a create: every sandbox running or paused with its files, committed snapshots kept, nothing half made or leaked", async () => {
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
  // the half-written commits are reaped, the committed snapshot stays
  expect(readdirSync(join(world.home, "snapshots", "staging"))).toEqual([]);
  expect(unnamedLayers(world.home)).toEqual([]);
  expect(existsSync(committed)).toBe(true);
  // A (its pause cut) runs on or is paused; B (its snapshot cut) runs on; only they have VMMs and work dirs
  const a = await world.client("crash-capture.ts", ["after", s.committed, s.a, s.b]);
  const listed = new Map<string, string>(a.listed);
  expect([...listed.keys()].sort()).toEqual([s.a, s.b].sort());
  expect(["running", "paused"]).toContain(listed.get(s.a)!);
  expect(listed.get(s.b)).toBe("running");
  expect(a.aFile).toBe("committed before the crash");
  expect(a.bFile).toBe("b");
  expect(a.bRun).toBe("still here\n");
  expect(a.snapshots).toContain(s.committed);
  expect(a.fromCommitted).toBe("committed before the crash");
  // a pause snapshot only for a sandbox listed paused
  const pauses = () => manifestsOf(world!.home).filter((m) => m.kind === "pause").map((m) => m.source.sandboxId as string);
  expect(pauses().every((id) => listed.get(id) === "paused")).toBe(true);
  expect(qemuPidsUnder(world.home, world.memDir).length).toBe(2);

  // a create cut once its VMM was spawned: gone, nothing of it left; the others run on
  const cr = await world.client("crash-capture.ts", ["crash-create", String(world.node!.pid)]);
  expect(cr.creating).toHaveLength(1);
  const [creating] = cr.creating as string[];
  await world.crash();
  await world.start();
  const b = await world.client("crash-capture.ts", ["after", s.committed]);
  expect(b.listed.map((l: string[]) => l[0]).sort()).toEqual([s.a, s.b].sort());
  expect(existsSync(join(world.home, "sandboxes", creating!))).toBe(false);
  expect(existsSync(join(world.home, "run", "vmm", `${creating}.json`))).toBe(false);
  expect(diskMounts(world.home).filter((l) => l.includes(`/sandboxes/${creating}/`))).toEqual([]);
  expect(qemuPidsUnder(world.home, world.memDir).length).toBe(2);
  await world.client("crash-capture.ts", ["kill", s.a, s.b]);
  expect(await world.stop()).toBe(0);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  expect(diskMounts(world.home)).toEqual([]);
  expect(world.slotNamespaces()).toEqual([]);
  expect(readdirSync(join(world.home, "sandboxes"))).toEqual([]);
  expect(unnamedLayers(world.home)).toEqual([]);
  expect(pauses()).toEqual([]);
}, 400_000);

test("kill -9 of the node during a fork, while its checkpoint is committed and then while its children start: the parents run on (adopted), children cut while starting are gone, committed snapshots kept; no stray VMM, mount, staging, work dir, fork checkpoint or unnamed layer after the restart", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  await world?.dispose();
  world = new NodeWorld();
  await world.start();
  const w = world;
  const s = await w.client("crash-fork.ts", ["setup"]);
  const committed = join(w.home, "snapshots", "manifests", `${s.committed}.json`);
  expect(existsSync(committed)).toBe(true);
  /** What must hold after each restart: only the listed sandboxes run (one VMM and work dir each), nothing half made. */
  const clean = async (parents: string[]) => {
    const a = await w.client("crash-fork.ts", ["after", s.committed]);
    const running = (a.listed as string[][]).filter((l) => l[1] === "running").map((l) => l[0]!);
    expect(a.listed.every((l: string[]) => l[1] === "running")).toBe(true);
    for (const p of parents) expect(running).toContain(p);
    expect(qemuPidsUnder(w.home, w.memDir).length).toBe(running.length);
    expect(readdirSync(join(w.home, "sandboxes")).sort()).toEqual([...running].sort());
    expect(diskMounts(w.home).filter((l) => l.includes("/sandboxes/")).length).toBe(running.length);
    expect(readdirSync(join(w.home, "snapshots", "staging"))).toEqual([]);
    expect(unnamedLayers(w.home)).toEqual([]);
    expect(manifestKinds(w.home).filter((k) => k === "pause")).toEqual([]);
    // a fork checkpoint stays only while a child that reached running runs from it
    const children = running.filter((id) => !parents.includes(id));
    expect(manifestKinds(w.home).filter((k) => k === "fork").length).toBe(children.length > 0 ? 1 : 0);
    expect(existsSync(committed)).toBe(true);
    expect(a.snapshots).toEqual([s.committed]);
    expect(a.fromCommitted).toBe("committed before the crash");
    return running;
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
  expect(await clean([s.p])).toEqual([s.p]);

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
  const running = await clean([s.p, p2.p]);

  // the parents (and any child that had started) ran on with their files; then they go
  const end = await w.client("crash-fork.ts", ["after", s.committed, ...running]);
  expect(end.parentFiles).toEqual(running.map(() => "committed before the crash"));
  expect(await w.stop()).toBe(0);
  expect(qemuPidsUnder(w.home, w.memDir)).toEqual([]);
  expect(readdirSync(join(w.home, "sandboxes"))).toEqual([]);
  expect(unnamedLayers(w.home)).toEqual([]);
  expect(manifestKinds(w.home).filter((k) => k === "fork" || k === "pause")).toEqual([]);
}, 600_000);
