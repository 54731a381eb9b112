/**
 * Templates are snapshots, end to end: `agentenv server` in a private namespace, the unmodified
 * e2b SDK, real QEMU VMs. Sandboxes of `base` are restores of the template's committed snapshot;
 * the memory image of that snapshot is served read-only once and shared by every VM restored from
 * it (the host page cache holds it once: later restores read almost nothing from the server).
 */
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { nodeForFile, qemuPidsUnder } from "./world.ts";

const node = nodeForFile();
const MiB = 1 << 20;

test("four sandboxes of one template: one memory image export, opened once; restores 2-4 read almost nothing from it", async () => {
  const world = node();
  const snap = JSON.parse(readFileSync(join(world.home, "templates", "base", "manifest.json"), "utf8")).snapshot;
  if (!snap) throw new Error("the base template in the test home has no snapshot: rebuild it with `agentenv template build-base`");
  type Dev = { id: string; path: string; refcount: number; bytesRead: number; imageOpens: number };
  const o = await world.client<{ after: { devices: Dev[]; createMs: number }[]; whoami: string[]; ids: string[]; seen: boolean[]; devicesAtEnd: Dev[] }>("shared-memory.ts");
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
  expect(o.seen).toEqual([true, false, false, false]);
  console.log(`shared memory image: restore 1 read ${(read[0]! / MiB).toFixed(1)} MiB from the server, restores 2-4 read ${read.slice(1).map((r, i) => ((r - read[i]!) / 1024).toFixed(0) + " KiB").join(", ")}; creates ${o.after.map((a) => a.createMs).join(", ")} ms`);
  // after the kills the image is no longer served, and no VMM is left
  expect(o.devicesAtEnd).toEqual([]);
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
}, 300_000);
