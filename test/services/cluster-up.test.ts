/**
 * `agentenv cluster up` supervising its members, all real (run from source in a private network
 * namespace; one node and no sandbox, so no VM boots): a node killed with SIGKILL whose restart
 * fails (its runtime-path lock is held) is tried again until it starts; and when `cluster up`
 * itself is killed with SIGKILL, every member (scheduler, node, gateway) stops by itself (their
 * stdin pipe from cluster up closes) instead of holding the ports of the next run.
 * Needs root (netns) and runs a node: hold /tmp/aenv-heavy.lock.
 */
import { afterAll, expect, test } from "bun:test";
import { alive, ClusterWorld } from "../e2e/cluster-world.ts";
import { vmPrerequisites } from "../e2e/world.ts";
import { waitFor } from "../helpers/wait.ts";

let world: ClusterWorld | undefined;
afterAll(async () => {
  await world?.dispose();
}, 120_000);

test("cluster up: a failed restart is tried again until the node starts; SIGKILL of cluster up stops every member", async () => {
  const missing = vmPrerequisites();
  if (missing) throw new Error(`prerequisites missing: ${missing}`);
  const w = (world = new ClusterWorld({
    nsPrefix: "acut",
    nodes: 1,
    gatewayPort: 18180,
    schedulerPort: 19190,
    nodePort: 18101,
    nodeRestartMs: 300,
    env: { AENV__pool__low_watermark: "0", AENV__pool__high_watermark: "0", AENV__cluster__up__service_restart_delay_ms: "300" },
  }));
  await w.up();
  const [scheduler, gateway, nodeA] = [w.pid("scheduler"), w.pid("gateway"), w.pid("node-a")];
  expect([scheduler, gateway, nodeA].every(alive)).toBe(true);

  // node-a's runtime-path lock is taken the moment it dies: its restarts fail until released
  const lock = w.holdNodeLock("node-a");
  const mark = w.out.length;
  process.kill(nodeA, "SIGKILL");
  await lock.held;
  await w.waitFor(/cluster: node-a exited \(SIGKILL\); restarting in 300 ms/, 60_000, mark);
  await w.waitFor(/cluster: node-a failed to restart: node-a exited before it was ready \(code 1\).*; trying again in 300 ms/, 60_000, mark);
  expect(w.out.slice(mark)).not.toMatch(/node node-a pid \d+/);
  await lock.release();
  await w.waitFor(/node node-a pid \d+/, 60_000, mark);
  const nodeA2 = w.pid("node-a", mark);
  expect(nodeA2).not.toBe(nodeA);
  expect(alive(nodeA2)).toBe(true);

  // cluster up dies without a chance to stop anything: each member sees its stdin close
  w.proc!.kill("SIGKILL");
  await w.proc!.exited;
  await waitFor("every member to stop after cluster up died", () => ![scheduler, gateway, nodeA2].some(alive), { timeoutMs: 60_000 });
}, 180_000);
