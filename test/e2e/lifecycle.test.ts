/**
 * Lifecycle routes with real VMs (agentenv server in a private netns): v1 create with autoPause
 * and a short timeout pauses at expiry, deprecated resume, network policy update, and the
 * `agentenv sandbox` CLI end to end (create, exec with exit code, pause, list, resume, kill), and
 * kills racing a create of the same sandbox, a VM that dies on its own (paused with its files, booted
 * on them at connect), VMMs killed in the middle of a pause, a connect's resume, a snapshot and a
 * fork, and again after a boot from a vm_lost pause (never lost: paused with its files), and a sandbox whose root disk a restarted disk daemon cannot serve again
 * because its upper is gone (failed: its files are lost; nothing left).
 */
import { expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, renameSync } from "node:fs";
import { join } from "node:path";
import { Database } from "bun:sqlite";
import { diskDaemonsUnder, logLines, nodeForFile, qemuPidsUnder, type NodeWorld } from "./world.ts";
import { waitFor } from "../helpers/wait.ts";

const node = nodeForFile();

/** Network slots the node's database gives sandbox `id`. */
function slotOf(w: NodeWorld, id: string): number[] {
  const db = new Database(join(w.home, "agentenv.db"), { readonly: true });
  try {
    return db.query<{ idx: number }, [string]>("SELECT idx FROM net_slots WHERE sandbox_id = ?").all(id).map((r) => r.idx);
  } finally {
    db.close();
  }
}

/** What of sandbox `id` is still held: its slot, disk mounts, work dir, and its pause snapshots in the repository. */
function held(w: NodeWorld, id: string): { slot: number[]; mounts: string[]; workDir: boolean; pauseSnapshots: number } {
  const dir = join(w.home, "snapshots", "manifests");
  const manifests = readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .map((f) => JSON.parse(readFileSync(join(dir, f), "utf8")));
  return {
    slot: slotOf(w, id),
    mounts: readFileSync("/proc/self/mountinfo", "utf8").split("\n").filter((l) => l.includes(join(w.home, "sandboxes", id))),
    workDir: existsSync(join(w.home, "sandboxes", id)),
    pauseSnapshots: manifests.filter((m) => m.kind === "pause" && m.source?.sandboxId === id).length,
  };
}

test("v1 create + autoPause: paused at expiry, 409 on pause again, resume 201 with the same token, network update, kill", async () => {
  const world = node();
  const o = await world.client("v1-autopause.ts");
  expect(o.create).toEqual({ status: 201, hasToken: true, trafficToken: true });
  expect(o.autoPaused).toBe("paused");
  expect(o.lifecycle).toEqual({ autoResume: false, onTimeout: "pause" });
  expect(o.pauseAgain).toBe(409);
  expect(o.resume).toEqual({ status: 201, sameToken: true });
  expect(o.resumeAgain).toBe(409);
  expect(o.run).toBe("back\n");
  expect(o.network).toBe(204);
  expect(o.badNetwork).toBe(400);
  // the PUT replaces the egress part; the ingress setting made at create stays (E2B: ingress is not touched)
  expect(o.detailNetwork).toEqual({ allowPublicTraffic: false, denyOut: ["1.1.1.1/32"], allowOut: ["example.com"] });
  expect(o.network2).toBe(204);
  expect(o.detailNetwork2).toEqual({ allowPublicTraffic: false, allowOut: ["example.com"] });
  expect(o.kill).toBe(204);
  expect(o.get).toBe(404);
}, 300_000);

test("agentenv sandbox CLI: create, exec (stdout, stderr, exit code, --user), pause, list, resume, kill", async () => {
  const world = node();
  const o = await world.client("cli-flow.ts");
  expect(o.create.code).toBe(0);
  expect(o.id).toMatch(/^[a-z0-9]{20}$/);
  // the create moved the template's spawn statistics
  expect(o.tplAfter.spawnCount).toBe(o.tplBefore.spawnCount + 1);
  expect(Date.parse(o.tplAfter.lastSpawnedAt)).toBeGreaterThanOrEqual(Date.parse(o.createStartedAt));
  expect(o.exec).toEqual({ code: 4, out: "bar baz\nuser\n", err: "err\n" });
  expect(o.execRoot).toMatchObject({ code: 0, out: "root\n" });
  expect(o.pause).toMatchObject({ code: 0, out: `paused ${o.id}\n` });
  expect(o.listPaused).toMatch(new RegExp(`^${o.id}\\s+base\\s+paused\\s.*via=cli$`, "m"));
  expect(o.resume).toMatchObject({ code: 0, out: `resumed ${o.id}\n` });
  expect(o.resumeAgain).toMatchObject({ code: 0, out: `${o.id} was already running\n` });
  expect(o.execAfter).toMatchObject({ code: 0, out: "alive\n" });
  expect(o.kill).toMatchObject({ code: 0, out: `killed ${o.id}\n` });
  expect(o.killAgain.code).toBe(1);
  expect(o.killAgain.err).toContain("404");
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
}, 300_000);

test("concurrent create and kill of one sandbox: the kills wait for the create; one 204, the rest 404; nothing left", async () => {
  const world = node();
  const o = await world.client("race.ts");
  expect(o).toEqual({ sawWhileCreating: true, createStatus: 201, sameId: true, kills: [204, 404, 404], getAfter: 404, listAfter: 0 });
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
}, 300_000);

test("a VM that dies on its own: the sandbox is paused with its files (reason vm_lost, in its log and events), what its VM held is freed, and connect boots it on its disk", async () => {
  const world = node();
  const { id } = await world.client("create-hold.ts");
  const pids = qemuPidsUnder(world.home, world.memDir);
  expect(pids).toHaveLength(1);
  expect(slotOf(world, id)).toHaveLength(1);
  process.kill(pids[0]!, "SIGKILL");
  const o = await world.client("vm-lost.ts", [id]);
  const why = "sandbox VM exited unexpectedly";
  expect(o.get).toEqual({ status: 200, state: "paused" });
  expect(o.listed).toEqual([[id, "paused"]]);
  expect(o.lifecycleLog).toEqual([`warn sandbox VM lost`, `warn sandbox paused with its files (filesystem only: the next connect boots it on its disk): ${why}`]);
  expect(o.events).toEqual(["sandbox.lifecycle.created", "sandbox.lifecycle.paused"]);
  expect(o.pausedEvent).toEqual({ pause_reason: "vm_lost", snapshot_kind: "filesystem", error: why });
  expect(o.proxy.status).toBe(502);
  expect(o.proxy.message).toContain("paused without its memory");
  expect(logLines(world, `sandbox paused with its files: ${why}`)).toMatchObject([{ sandboxId: id, reason: why }]);
  // what the dead VM held was freed before the sandbox showed paused (its slot, disk export, work
  // dir); its disk is a filesystem-only pause snapshot
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  expect(held(world, id)).toEqual({ slot: [], mounts: [], workDir: false, pauseSnapshots: 1 });
  // connect cold-boots it on its disk: the upload and the synced /tmp file are there
  const c = await world.client("connect-files.ts", [id]);
  expect(c.kept).toBe("written before its VM went");
  expect(c.tmp).toBe("t\n");
  expect(c.run).toBe("booted on its disk\n");
  expect(c.listedAfterConnect).toEqual([[id, "running"]]);
  expect(c).toMatchObject({ kill: true, getAfterKill: 404, listedEnd: 0 });
  expect(c.events).toEqual(["sandbox.lifecycle.created", "sandbox.lifecycle.paused", "sandbox.lifecycle.resumed", "sandbox.lifecycle.killed"]);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  await waitFor("the killed sandbox's files to be removed", () => !existsSync(join(world.home, "sandboxes", id)), { timeoutMs: 20_000 });
  expect(held(world, id)).toEqual({ slot: [], mounts: [], workDir: false, pauseSnapshots: 0 });
}, 300_000);

/** Sandbox `id`'s stored state and snapshot kind, as the node's database has them now. */
function stored(w: NodeWorld, id: string): { state: string; kind: string | null } {
  const db = new Database(join(w.home, "agentenv.db"), { readonly: true });
  try {
    const r = db.query<{ state: string; snapshot_kind: string | null }, [string]>("SELECT state, snapshot_kind FROM sandboxes WHERE id = ?").get(id);
    return { state: r?.state ?? "none", kind: r?.snapshot_kind ?? null };
  } finally {
    db.close();
  }
}

/** The pid of sandbox `id`'s VMM (its QEMU names it), or undefined. */
function vmmOf(w: NodeWorld, id: string): number | undefined {
  return qemuPidsUnder(w.home, w.memDir).find((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(`aenv-${id}`);
    } catch {
      return false;
    }
  });
}

/** SIGKILL sandbox `id`'s VMM once `when` holds (polled every few ms); returns the killed pid. */
async function killVmmWhen(w: NodeWorld, id: string, what: string, when: () => boolean): Promise<number> {
  const pid = await waitFor(what, () => (when() ? vmmOf(w, id) : undefined), { timeoutMs: 120_000, maxIntervalMs: 5 });
  process.kill(pid, "SIGKILL");
  return pid;
}

/** Commits in progress in the node's snapshot repository (a capture has begun), by staging folder. */
function staging(w: NodeWorld): string[] {
  const dir = join(w.home, "snapshots", "staging");
  return existsSync(dir) ? readdirSync(dir) : [];
}

/** Whether a commit began that was not in progress in `before`. */
function newCommit(w: NodeWorld, before: string[]): boolean {
  return staging(w).some((s) => !before.includes(s));
}

/**
 * Wait until sandbox `id`, whose VM was killed, settled paused in the database (a failed pause
 * passes through running until the VM's end is seen); returns its snapshot kind.
 */
async function settledPaused(w: NodeWorld, id: string): Promise<string | null> {
  const r = await waitFor(`sandbox ${id} to settle paused (or end)`, () => {
    const x = stored(w, id);
    return x.state === "paused" || x.state === "killed" || x.state === "failed" ? x : undefined;
  }, { timeoutMs: 120_000 });
  expect(r.state).toBe("paused");
  return r.kind;
}

test("a VMM killed in the middle of an operation never loses its sandbox: during a pause, during the resume of connect, after a boot from a vm_lost pause, during a snapshot and a fork: paused with its files each time, connect boots it on them", async () => {
  const world = node();
  const { id } = await world.client("create-hold.ts");
  const files = { ok: true, kept: "written before its VM went", tmp: "t\n", run: "booted on its disk\n" };
  // (a) during a pause (its capture begun): the pause fails, the sandbox is paused with its files
  const pausing = world.client("vm-op.ts", ["pause", id]);
  await killVmmWhen(world, id, "the pause to begin", () => stored(world, id).state === "pausing");
  const pause = await pausing;
  expect(await settledPaused(world, id)).toBe(pause.ok ? "memory" : "filesystem");
  expect(await world.client("vm-op.ts", ["check", id])).toEqual({ ...files, marks: "1" });
  // (c) a second VM loss, after a boot from a vm_lost pause (its base is its own pause snapshot)
  process.kill(vmmOf(world, id)!, "SIGKILL");
  expect(await settledPaused(world, id)).toBe("filesystem");
  // (b) the VM a connect boots is killed before the connect answered: back to paused on the same snapshot
  // (a VM killed while it restores the boot snapshot makes the resume boot another: that one too)
  let connected = false;
  const connecting = world.client("vm-op.ts", ["check", id]).finally(() => (connected = true));
  await killVmmWhen(world, id, "the resume's VM", () => stored(world, id).state === "resuming");
  while (!connected && stored(world, id).state === "resuming") {
    const again = vmmOf(world, id);
    if (again) process.kill(again, "SIGKILL");
    await Bun.sleep(5);
  }
  const cut = await connecting;
  expect(cut.ok).toBe(false);
  expect(await settledPaused(world, id)).toBe("filesystem");
  expect(await world.client("vm-op.ts", ["check", id])).toEqual({ ...files, marks: "2" });
  // (d) during a snapshot (its capture begun): the snapshot fails, the sandbox keeps its files
  const marks = Number((await world.client("vm-op.ts", ["check", id])).marks);
  let before = staging(world);
  const snapshotting = world.client("vm-op.ts", ["snapshot", id]);
  await killVmmWhen(world, id, "the snapshot's capture", () => newCommit(world, before));
  const snap = await snapshotting;
  expect(snap.ok).toBe(false);
  expect(await settledPaused(world, id)).toBe("filesystem");
  expect(await world.client("vm-op.ts", ["check", id])).toEqual({ ...files, marks: String(marks + 1) });
  // (d) during a fork's checkpoint: the fork fails (no child), the parent keeps its files
  before = staging(world);
  const forking = world.client("vm-op.ts", ["fork", id]);
  await killVmmWhen(world, id, "the fork's checkpoint", () => newCommit(world, before));
  const fork = await forking;
  expect(fork.ok).toBe(false);
  expect(await settledPaused(world, id)).toBe("filesystem");
  const last = await world.client("vm-op.ts", ["check", id]);
  expect(last).toEqual({ ...files, marks: String(marks + 2) });
  // nothing of the failed operations is left: one sandbox, one VMM, no commit in progress, no fork child
  const c = await world.client("connect-files.ts", [id]);
  expect(c).toMatchObject({ kill: true, getAfterKill: 404, listedEnd: 0 });
  expect(c.events).not.toContain("sandbox.lifecycle.failed");
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  expect(staging(world)).toEqual([]);
}, 900_000);

test("a sandbox whose root disk the restarted disk daemon cannot serve again (its upper gone): failed, not paused (its files are lost), the log and its failed event say why, nothing left", async () => {
  const world = node();
  const { id } = await world.client("create-hold.ts");
  expect(qemuPidsUnder(world.home, world.memDir)).toHaveLength(1);
  // the running daemon has the upper open; the next one cannot open it (recovery fails), nor can
  // the node commit it as a pause snapshot: the sandbox's files are lost
  const upper = join(world.home, "sandboxes", id, "upper", "upper.data");
  renameSync(upper, `${upper}.away`);
  const daemons = diskDaemonsUnder(world.home);
  expect(daemons).toHaveLength(1);
  process.kill(daemons[0]!, "SIGKILL");
  const o = await world.client("poll-gone.ts", [id]);
  expect(o).toMatchObject({ status: 404, kill: false, proxy: 502, listed: 0, logs: 404 });
  // it went through pausing (the node tried to keep its disk), then failed, saying both whys
  expect(o.events).toEqual(["sandbox.lifecycle.created", "sandbox.lifecycle.failed"]);
  expect(o.failed.failed_in).toBe("pausing");
  expect(o.failed.error).toMatch(/^root disk lost: not recovered after a daemon restart: .+; its disk could not be kept: .+/);
  const failed = logLines(world, `sandbox failed: ${o.failed.error}`);
  expect(failed).toHaveLength(1);
  expect(failed[0]).toMatchObject({ sandboxId: id });
  // the VMM goes with it, and every trace of it: slot, export, work dir (the moved upper too), no
  // pause snapshot claiming its files; the restarted daemon serves on (the next test's sandbox gets its disks)
  await waitFor("the failed sandbox's VMM to stop", () => qemuPidsUnder(world.home, world.memDir).length === 0, { timeoutMs: 30_000 });
  await waitFor("the failed sandbox's files to be removed", () => !existsSync(join(world.home, "sandboxes", id)), { timeoutMs: 20_000 });
  expect(held(world, id)).toEqual({ slot: [], mounts: [], workDir: false, pauseSnapshots: 0 });
  expect(readdirSync(join(world.home, "snapshots", "staging"))).toEqual([]);
  expect(diskDaemonsUnder(world.home)).toHaveLength(1);
  expect(diskDaemonsUnder(world.home)[0]).not.toBe(daemons[0]);
}, 300_000);

test("autoResume: proxy traffic to a paused sandbox resumes it", async () => {
  const world = node();
  const o = await world.client("autoresume.ts");
  expect(o).toEqual({ create: 201, lifecycle: { autoResume: true, onTimeout: "pause" }, pause: 204, stateBefore: "paused", proxied: 204, stateAfter: "running", kill: 204 });
}, 300_000);
