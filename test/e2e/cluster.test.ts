/**
 * A cluster end to end on one host, all real: `agentenv cluster up` (scheduler with SQLite
 * bindings, gateway, two nodes with their own data dirs, runtime paths and network prefixes,
 * QEMU microVMs booting the base template) in a private network namespace, and the unmodified
 * e2b SDK pointed at the gateway. Four sandboxes land on both nodes; commands, files, a sandbox
 * port over HTTP and WebSocket, list, pause/resume; the scheduler (and then the gateway, whose
 * route cache goes with it) is killed and restarted and every sandbox still routes; one node is
 * killed with SIGKILL: its sandboxes answer 502 naming it while the other node's keep working,
 * the scheduler marks it UNHEALTHY and keeps its bindings (a node may come back); the node is
 * restarted by `cluster up`, adopts the running VMs it left and re-reports them: the gateway
 * routes them to it again and the SDK runs commands in them. The test holds the dead node's
 * runtime-path lock until it has checked the scheduler, so the restart (tried again by
 * `cluster up` until it succeeds) cannot come first however slow the host is.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { ClusterWorld } from "./cluster-world.ts";
import { vmPrerequisites } from "./world.ts";

const NODE_RESTART_MS = 3000;

const missing = vmPrerequisites();
let world: ClusterWorld | undefined;
beforeAll(async () => {
  if (missing) return;
  world = new ClusterWorld({ nsPrefix: "aclu", nodes: 2, gatewayPort: 18080, schedulerPort: 19090, nodePort: 18001, nodeRestartMs: NODE_RESTART_MS, env: { AENV__pool__low_watermark: "1", AENV__pool__high_watermark: "2" } });
  await world.up();
}, 180_000);
afterAll(async () => {
  await world?.dispose();
}, 120_000);

test("cluster: SDK through the gateway on two nodes; scheduler and gateway restarts keep routing; a killed node answers 502 while the other serves", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  const w = world!;
  expect(Object.keys(w.nodes).sort()).toEqual(["node-a", "node-b"]);

  const o = await w.client("cluster-flow.ts", [JSON.stringify(w.nodes)]);
  const ids = o.ids as string[];
  expect(ids.length).toBe(4);
  const placed = ids.map((id) => o.placement[id]);
  expect(placed.filter((n) => n === "node-a").length).toBe(2);
  expect(placed.filter((n) => n === "node-b").length).toBe(2);
  expect(o.runs).toEqual(ids.map((_, i) => `run-${i}\nuser\n`));
  expect(o.files).toEqual([true, true, true, true]);
  for (const n of ["node-a", "node-b"]) {
    expect(o.ports[n].http).toBe(`http from ${o.ports[n].hostname} path /hello?x=1`);
    expect(o.ports[n].ws).toBe(`echo:hi-${n}`);
  }
  expect(o.listed).toEqual([...ids].sort());
  expect(o.pausedState).toBe("paused");
  expect(o.afterResume).toEqual({ run: "back\n", file: true });

  // the scheduler dies and comes back from its SQLite file; then the gateway too (its route
  // cache is gone: every route now comes from the restarted scheduler)
  await w.killAndAwaitRestart("scheduler", 30_000);
  await w.killAndAwaitRestart("gateway", 30_000);
  const after = await w.client("cluster-check.ts", [JSON.stringify(ids)]);
  for (const id of ids) expect(after[id]).toMatchObject({ status: 200, run: `alive-${id}` });

  // node-b killed: its sandboxes answer 502 naming it, quickly; node-a's keep working. Its
  // runtime-path lock is taken by a waiting flock the moment it dies: no restart can succeed
  // until the test lets go of it.
  const lock = w.holdNodeLock("node-b");
  const mark = w.out.length;
  process.kill(w.pid("node-b"), "SIGKILL");
  await lock.held;
  await w.waitFor(/cluster: node-b exited \(SIGKILL\)/, 10_000, mark);
  const down = await w.client("cluster-check.ts", [JSON.stringify(ids)]);
  for (const id of ids) {
    if (o.placement[id] === "node-b") {
      expect(down[id].status).toBe(502);
      expect(down[id].message).toContain("node node-b (http://127.0.0.1:18002) is unreachable");
      expect(down[id].run).not.toContain("alive");
    } else expect(down[id]).toMatchObject({ status: 200, run: `alive-${id}` });
  }
  // the scheduler: node-b UNHEALTHY (unschedulable), its bindings kept while it is away
  const q = await w.client("scheduler-query.ts", ["127.0.0.1:19090", "node-b", JSON.stringify(ids)]);
  expect(w.out.slice(mark)).not.toMatch(/node node-b pid \d+/);
  expect(q.statuses).toEqual({ "node-a": "NODE_STATUS_READY", "node-b": "NODE_STATUS_UNHEALTHY" });
  for (const id of ids) expect(q.lookups[id]).toBe(o.placement[id]);
  // let node-b start: cluster up's next try succeeds; it adopts the VMs its killed run left and
  // its roster names them again: the gateway routes them to it, the SDK runs commands in them
  await w.waitFor(/cluster: node-b failed to restart: .*; trying again in \d+ ms/, NODE_RESTART_MS + 60_000, mark);
  await lock.release();
  await w.waitFor(/node node-b pid \d+/, 2 * NODE_RESTART_MS + 60_000, mark);
  const bIds = ids.filter((id) => o.placement[id] === "node-b");
  expect(bIds.length).toBe(2);
  const back = await w.client("cluster-check.ts", [JSON.stringify(bIds)]);
  for (const id of bIds) expect(back[id]).toMatchObject({ status: 200, run: `alive-${id}` });
  const q2 = await w.client("scheduler-query.ts", ["127.0.0.1:19090", "node-b", JSON.stringify(ids)]);
  expect(q2.statuses).toEqual({ "node-a": "NODE_STATUS_READY", "node-b": "NODE_STATUS_READY" });
  for (const id of ids) expect(q2.lookups[id]).toBe(o.placement[id]);
  console.log(`cluster e2e steps (ms): ${JSON.stringify(o.steps)}; down-check ms: ${JSON.stringify(Object.values(down).map((d: any) => d.ms))}`);
}, 900_000);
