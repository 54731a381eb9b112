/**
 * End to end with the real parts: `agentenv server` (API, orchestrator, proxy, SQLite, network
 * slots, QEMU microVMs booting the base template, envd in the guest) in a private network
 * namespace, driven by the unmodified e2b@2.51.0 npm SDK.
 */
import { expect, test } from "bun:test";
import { nodeForFile, qemuPidsUnder } from "./world.ts";

const node = nodeForFile();

test("e2b SDK: create, run, write/read, list, setTimeout, isolation of a second sandbox, kill", async () => {
  const world = node();
  const o = await world.client("sdk-flow.ts");
  expect(o.run).toEqual({ stdout: "hello\nuser\n", stderr: "", exitCode: 0 });
  expect(o.env).toBe("hi there\n");
  expect(o.failed).toEqual({ name: "CommandExitError", exitCode: 3, stderr: "oops\n" });
  expect(o.filesEqual).toBe(true);
  expect(o.fileSize).toBe(300_000);
  expect(o.note).toBe("from a");
  expect(o.listed).toEqual([{ id: o.idA, state: "running", metadata: { suite: "e2e", who: "a" } }]);
  expect(o.listedByMeta).toEqual([o.idA]);
  expect(o.timeout.after).toBeLessThan(o.timeout.before);
  // 30 s from the moment the node handled setTimeout, which lies between t0 and t1
  expect(o.timeout.after).toBeGreaterThanOrEqual(o.timeout.t0 + 30_000);
  expect(o.timeout.after).toBeLessThanOrEqual(o.timeout.t1 + 30_000);
  expect(o.running).toBe(true);
  expect(o.bSeesNote).toBe(false);
  expect(o.bSeesData).toBe(false);
  expect(o.aSleepers).toBe("0");
  expect(o.hostnames[0]).not.toBe(o.hostnames[1]);
  expect(o.listedBoth).toEqual([o.idA, o.idB].sort());
  expect(o.killB).toBe(true);
  expect(o.killA).toBe(true);
  expect(o.killAgain).toBe(false);
  expect(o.listedAfter).toEqual([]);
  expect(o.runningAfterKill).toBe(false);
  // nothing left: no VMM process, no slot in use beyond the warm pool, no work dirs
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  console.log(`e2e: create took ${o.createMs} ms; steps (ms since start): ${JSON.stringify(o.steps)}`);
}, 300_000);
