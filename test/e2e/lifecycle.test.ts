/**
 * Lifecycle routes with real VMs (agentenv server in a private netns): v1 create with autoPause
 * and a short timeout pauses at expiry, deprecated resume, network policy update, and the
 * `agentenv sandbox` CLI end to end (create, exec with exit code, pause, list, resume, kill), and
 * kills racing a create of the same sandbox, a VM that dies on its own, and a sandbox whose root
 * disk a restarted disk daemon cannot serve again (the disk is lost under it).
 */
import { expect, test } from "bun:test";
import { existsSync, readFileSync, renameSync } from "node:fs";
import { join } from "node:path";
import { diskDaemonsUnder, nodeForFile, qemuPidsUnder } from "./world.ts";
import { waitFor } from "../helpers/wait.ts";

const node = nodeForFile();

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

test("a VM that dies on its own: the sandbox disappears (404, proxy 502) and its VMM, disk server and slot are freed", async () => {
  const world = node();
  const { id } = await world.client("create-hold.ts");
  const pids = qemuPidsUnder(world.home, world.memDir);
  expect(pids).toHaveLength(1);
  process.kill(pids[0]!, "SIGKILL");
  const o = await world.client("poll-gone.ts", [id]);
  expect(o).toMatchObject({ status: 404, kill: false, proxy: 502, listed: 0 });
  // the API forgets the sandbox first; its clean-up (slot, disk server, files) follows
  await waitFor("the sandbox's files to be removed", () => !existsSync(join(world.home, "sandboxes", id)), { timeoutMs: 20_000 });
  expect(readFileSync("/proc/self/mountinfo", "utf8").includes(join(world.home, "sandboxes", id))).toBe(false);
}, 300_000);

test("a sandbox whose root disk the restarted disk daemon cannot serve again: failed (404, proxy 502), its VMM stopped, the node log says why", async () => {
  const world = node();
  const { id } = await world.client("create-hold.ts");
  expect(qemuPidsUnder(world.home, world.memDir)).toHaveLength(1);
  // the running daemon has the upper open; the next one cannot open it (recovery fails)
  const upper = join(world.home, "sandboxes", id, "upper", "upper.data");
  renameSync(upper, `${upper}.away`);
  const daemons = diskDaemonsUnder(world.home);
  expect(daemons).toHaveLength(1);
  process.kill(daemons[0]!, "SIGKILL");
  const o = await world.client("poll-gone.ts", [id]);
  expect(o).toMatchObject({ status: 404, kill: false, proxy: 502, listed: 0 });
  expect(world.log).toContain(`"sandboxId":"${id}","reason":"root disk lost: not recovered after a daemon restart: `);
  expect(world.log).toContain("sandbox failed: root disk lost: not recovered after a daemon restart");
  // the VMM goes with it; the restarted daemon serves on (the next test's sandbox gets its disks)
  await waitFor("the failed sandbox's VMM to stop", () => qemuPidsUnder(world.home, world.memDir).length === 0, { timeoutMs: 30_000 });
  expect(diskDaemonsUnder(world.home)).toHaveLength(1);
  expect(diskDaemonsUnder(world.home)[0]).not.toBe(daemons[0]);
}, 300_000);

test("autoResume: proxy traffic to a paused sandbox resumes it", async () => {
  const world = node();
  const o = await world.client("autoresume.ts");
  expect(o).toEqual({ create: 201, lifecycle: { autoResume: true, onTimeout: "pause" }, pause: 204, stateBefore: "paused", proxied: 204, stateAfter: "running", kill: 204 });
}, 300_000);
