/**
 * Templates are snapshots, end to end: `agentenv server` in a private namespace, the unmodified
 * e2b SDK, real QEMU VMs. Sandboxes of `base` are restores of the template's committed snapshot;
 * the memory image of that snapshot is served read-only once and shared by every VM restored from
 * it (the host page cache holds it once: later restores read almost nothing from the server).
 * The snapshot API through the SDK: createSnapshot, listSnapshots, create from a snapshot, fork,
 * a tree of snapshots, deleteSnapshot (fixtures/snapshot-api.ts). The memory image's server
 * (the disk daemon) SIGKILLed under two guests mapping it: they run on, the node starts it again
 * and the new one serves the image (fixtures/memory-server-crash.ts).
 */
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { diskDaemonsUnder, nodeForFile, qemuPidsUnder } from "./world.ts";

const node = nodeForFile();
const MiB = 1 << 20;

test("four sandboxes of one template: one memory image export, opened once; restores 2-4 read almost nothing from it; it stays open (warm) after the last one", async () => {
  const world = node();
  const snap = JSON.parse(readFileSync(join(world.home, "templates", "base", "manifest.json"), "utf8")).snapshot;
  if (!snap) throw new Error("the base template in the test home has no snapshot: rebuild it with `agentenv template build-base`");
  type Dev = { id: string; path: string; refcount: number; bytesRead: number; imageOpens: number };
  const o = await world.client<{ after: { devices: Dev[]; createMs: number }[]; whoami: string[]; ids: string[]; seen: boolean[]; clocks: number[]; hostBefore: number; hostAfter: number; devicesAtEnd: Dev[]; again: Dev[] }>("shared-memory.ts");
  // one shared device for the one image, opened once, held by every running sandbox
  for (const a of o.after) expect(a.devices.length).toBe(1);
  const dev = o.after[0]!.devices[0]!;
  expect(dev.path.endsWith("/memory.img")).toBe(true);
  expect(o.after.map((a) => a.devices[0]!.id)).toEqual([dev.id, dev.id, dev.id, dev.id]);
  expect(o.after.map((a) => a.devices[0]!.imageOpens)).toEqual([1, 1, 1, 1]);
  expect(o.after.map((a) => a.devices[0]!.refcount)).toEqual([1, 1, 1, 1]); // the node holds one reference per image
  const read = o.after.map((a) => a.devices[0]!.bytesRead);
  // the first restore faults its working set in through the server; the next ones find it cached
  expect(read[0]!).toBeGreaterThan(4 * MiB);
  for (let i = 1; i < 4; i++) expect(read[i]! - read[i - 1]!).toBeLessThan(Math.max(2 * MiB, read[0]! / 20));
  // each sandbox is its own: env vars and host name from its create, its own disk
  expect(o.whoami).toEqual(o.ids.map((id, i) => `box${i} ${id}`));
  // the clock of each restored guest was set by /init from its create's timestamp: it reads
  // between the host's clock before and after the commands (less the /init request's transit
  // and envd's 50 ms tolerance; up to its 5 s ahead), while a clock left as restored would read
  // the snapshot's time plus seconds (the snapshot is older than 30 s)
  const snapAt = Date.parse(JSON.parse(readFileSync(join(world.home, "snapshots", "manifests", `${snap}.json`), "utf8")).createdAt);
  expect(o.hostBefore - snapAt).toBeGreaterThan(30_000);
  expect(o.clocks.length).toBe(4);
  for (const c of o.clocks) {
    expect(c).toBeGreaterThanOrEqual(o.hostBefore - 3000);
    expect(c).toBeLessThanOrEqual(o.hostAfter + 5000);
  }
  expect(o.seen).toEqual([true, false, false, false]);
  console.log(`shared memory image: restore 1 read ${(read[0]! / MiB).toFixed(1)} MiB from the server, restores 2-4 read ${read.slice(1).map((r, i) => ((r - read[i]!) / 1024).toFixed(0) + " KiB").join(", ")}; creates ${o.after.map((a) => a.createMs).join(", ")} ms`);
  // after the kills the image is still served, held by the node alone ([snapshot] warm_images),
  // and a fifth restore from it neither reopens it nor reads it again
  expect(o.devicesAtEnd.map((d) => [d.id, d.imageOpens, d.refcount])).toEqual([[dev.id, 1, 1]]);
  expect(o.again.map((d) => [d.id, d.imageOpens])).toEqual([[dev.id, 1]]);
  expect(o.again[0]!.bytesRead - o.devicesAtEnd[0]!.bytesRead).toBeLessThan(Math.max(2 * MiB, read[0]! / 20));
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
}, 300_000);

test("SDK snapshots: createSnapshot, listSnapshots, create from it, fork({count: 2}) of a running parent, a tree of snapshots (restore to any), deleteSnapshot while in use, unknown ids", async () => {
  const world = node();
  const o = await world.client("snapshot-api.ts", [], 600_000);
  const before = "written before the snapshot\n";
  const both = `${before}written after the snapshot\ntick-running\n`;
  expect(o.snap.snapshotId).toMatch(/^[a-z0-9]{20}$/);
  expect(o.snap.names).toContain("e2e-snap");
  expect(o.listedBySandbox).toEqual([o.snap.snapshotId]);
  expect(o.listedByName).toEqual([o.snap.snapshotId]);
  expect(o.listedByOther).toEqual([]);
  // a sandbox of the snapshot: the file and the running process of that moment, not what came later
  expect(o.fromSnap).toMatchObject({ probe: `${before}no-after\ntick-running\n`, ticking: true });
  // two children with the parent's files and its process, each its own sandbox
  expect(o.forks.length).toBe(2);
  for (const f of o.forks) expect(f).toMatchObject({ probe: both, ticking: true, mine: f.id });
  expect(new Set([o.parentId, o.fromSnap.id, ...o.forks.map((f: { id: string }) => f.id)]).size).toBe(4);
  // the parent runs on, same id and expiry, its process still counting, none of the children's files
  expect(o.parentAfterFork).toEqual({ state: "running", sameEnd: true, probe: both, ticking: true, seesForkFile: false });
  // a tree: B (a later snapshot of the parent) and C (of the sandbox made from the first) descend
  // from the snapshots they were taken over; a create from any of them restores its own moment
  // (files and the running process), whatever the sandboxes did since
  const t = o.tree;
  const templateSnap = t.parents.a;
  expect(templateSnap).toMatch(/^[a-z0-9]{20}$/);
  expect(t.parents).toEqual({ a: templateSnap, b: templateSnap, c: o.snap.snapshotId });
  expect(t.listedByParent).toEqual([o.snap.snapshotId, t.b]);
  expect(t.listedByFromSnap).toEqual([t.c]);
  expect(t.seen).toEqual({
    a: { version: "A\nno-from-snap\n", ticking: true },
    b: { version: "B\nno-from-snap\n", ticking: true },
    c: { version: "A then fromSnap\nfromSnap's own file\n", ticking: true },
  });
  expect(t.parentNow).toBe("after B\nno-from-snap\n");
  expect(t.fromSnapNow).toBe("after C\nfromSnap's own file\n");
  expect(o.treeDeleted).toEqual([true, true]);
  // deleted while a sandbox runs from it: unlisted and no longer creatable at once, the running
  // sandbox unharmed, its files removed once that sandbox is gone
  expect(o.deleted).toBe(true);
  expect(o.listedAfterDelete).toEqual([]);
  expect(o.manifestWhileUsed).toBe(true);
  expect(o.fromSnapAfterDelete).toBe(before.trim());
  expect(o.createAfterDelete.message).toBe(`404: template '${o.snap.snapshotId}' not found`);
  expect(o.manifestAfterLastUser).toBe(false);
  expect(o.deletedAgain).toBe(false);
  // unknown ids are 404s, whatever the call
  expect(o.createUnknown.message).toBe("404: template 'zzzzzzzzzzzzzzzzzzzz' not found");
  expect(o.snapshotUnknown.name).toBe("SandboxNotFoundError");
  expect(o.forkUnknown.name).toBe("SandboxNotFoundError");
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
}, 600_000);

test("a corrupt layer fails the restore with snapshot.corrupt_layer; the source sandbox and the snapshot are untouched", async () => {
  const world = node();
  const o = await world.client("snapshot-corrupt.ts");
  expect(o.corruptCreate.message).toStartWith("500: ");
  expect(o.corruptCreate.message).toContain("does not match its digest");
  expect(o.sourceAfter).toEqual({ file: "source", run: "alive\n" });
  expect(o.stillListed).toBe(true);
  expect(o.repairedCreate).toBe("source");
  expect(world.log).toContain('"code":"snapshot.corrupt_layer"');
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
}, 300_000);

test("kill -9 of the memory image's server under two restored guests: they keep running commands and touching new RAM; the daemon is started again and serves the same image", async () => {
  const world = node();
  const daemons = diskDaemonsUnder(world.home);
  expect(daemons.length).toBe(1);
  type Shared = { id: string; path: string; refcount: number; imageOpens: number; bytesRead: number };
  const o = await world.client<{
    before: { pid: number; shared: Shared[] };
    during: { exitCode: number; stdout: string }[];
    after: { pid: number; recovered: number; shared: Shared[] };
    guests: { sameBoot: boolean; file: string; ram: string; ticked: boolean }[];
    sharedAfterRuns: Shared[];
    sharedAtEnd: Shared[];
  }>("memory-server-crash.ts", [String(daemons[0])], 300_000);
  // one image, mapped by both guests, served by the daemon that was killed
  expect(o.before.pid).toBe(daemons[0]!);
  expect(o.before.shared.length).toBe(1);
  const image = o.before.shared[0]!;
  expect(image.path.endsWith("/memory.img")).toBe(true);
  // the guests' work across the crash: RAM they had not touched yet, and commands, all answered
  expect(o.during).toEqual([
    { exitCode: 0, stdout: "touched-0\n" },
    { exitCode: 0, stdout: "touched-1\n" },
  ]);
  // a new daemon with the same devices: the image under the same id and path, opened once by it,
  // its pages read through it (its counters start at its own reads)
  expect(o.after.pid).not.toBe(o.before.pid);
  expect(o.after.recovered).toBeGreaterThanOrEqual(3); // two root disks and the image at least
  expect(o.after.shared.map((d) => ({ id: d.id, path: d.path, refcount: d.refcount, imageOpens: d.imageOpens }))).toEqual([{ id: image.id, path: image.path, refcount: 1, imageOpens: 1 }]);
  expect(o.sharedAfterRuns.length).toBe(1);
  expect(o.sharedAfterRuns[0]!.bytesRead).toBeGreaterThan(0);
  expect(o.sharedAfterRuns[0]!.bytesRead).toBeGreaterThanOrEqual(o.after.shared[0]!.bytesRead);
  // the same guests (no reboot), their counters moved on, their disks and RAM work
  expect(o.guests).toEqual([0, 1].map((i) => ({ sameBoot: true, file: `written after the crash by ${i}`, ram: "ram-ok\n", ticked: true })));
  // the last user gone, the new daemon still serves the image, held by the node alone for the
  // next restore ([snapshot] warm_images); the node logged the crash and the restart
  expect(o.sharedAtEnd.map((d) => [d.id, d.refcount])).toEqual([[image.id, 1]]);
  console.log(`memory server crash: daemon ${o.before.pid} killed, ${o.after.pid} recovered ${o.after.recovered} devices; the new one served ${(o.sharedAfterRuns[0]!.bytesRead / 1024).toFixed(0)} KiB of the image`);
  expect(world.log).toContain('"msg":"disk daemon died"');
  expect(world.log).toContain('"msg":"disk daemon started again"');
  expect(diskDaemonsUnder(world.home)).toEqual([o.after.pid]);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
}, 300_000);
