/**
 * Free page reporting through a real node (issue 32): sandboxes of the base template restored
 * from its memory snapshot (the node's shared memory export, QEMU with the balloon); the SDK
 * client (fixtures/memory-return.ts) has a guest allocate and free 256 MiB and watches its QEMU
 * give back the private copies, then pauses and resumes it, with a neighbour sandbox of the same
 * image running all along.
 */
import { expect, test } from "bun:test";
import { nodeForFile } from "./world.ts";

const node = nodeForFile();

test("a guest that allocates and frees 256 MiB hands >= 200 MiB back to the host; pause, resume and a neighbour keep their memory", async () => {
  const o = await node().client("memory-return.ts", ["60"]);
  // the process's pages became QEMU's private copies, then went back (bounded wait, no speed claim)
  expect(o.peakKiB - o.beforeKiB).toBeGreaterThan(250 * 1024);
  expect(o.peakKiB - o.lowKiB).toBeGreaterThanOrEqual(200 * 1024);
  expect(o.keep).toMatch(/^[0-9a-f]{64}$/);
  expect(o.keptAfterResume).toBe(o.keep);
  expect(o.otherAfter).toBe(o.otherKeep);
  expect(o.otherKeep).not.toBe(o.keep);
  console.log(`memory return: ${((o.peakKiB - o.lowKiB) / 1024).toFixed(0)} MiB of QEMU's private guest RAM back within ${(o.returnedAfterMs / 1000).toFixed(1)} s`);
}, 600_000);
