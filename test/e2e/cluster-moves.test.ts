/**
 * Sandboxes outliving their node in a cluster, all real: `agentenv cluster up` (scheduler with
 * SQLite bindings, gateway, two nodes, QEMU microVMs) in a private network namespace, a real S3
 * server (s3rver) in that namespace as the nodes' shared snapshot store (`push_kinds` with
 * "pause"), and the unmodified e2b SDK through the gateway. One sandbox (a file, a counting
 * background process), paused:
 * 1. its node is killed (SIGKILL) and restarted by `cluster up` on the same data dir: while it is
 *    down the sandbox answers 502 naming the node (its binding stays), then the node's first
 *    roster names it again and the SDK connects to it there: file and process as they were;
 * 2. paused again (its pause snapshot and record pushed), its node is killed and kept down: a
 *    connect through the gateway moves it to the other node once the node has been silent for
 *    `rebind_after_secs`, which resumes it from the store under the same id: the file, and the
 *    counter going on from where it was (memory restored);
 * 3. the killed node comes back: the scheduler tells it the sandbox is the other node's, and it
 *    drops its copy (its own API answers 404) while the sandbox runs on, on the other node.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { ClusterWorld } from "./cluster-world.ts";
import { S3rver, S3RVER_KEY } from "../helpers/s3rver.ts";
import { vmPrerequisites } from "./world.ts";
import { waitFor } from "../helpers/wait.ts";

const NODE_RESTART_MS = 2000;
const REBIND_AFTER_SECS = 8;
const PREFIX = "e2e/";

const missing = vmPrerequisites();
let world: ClusterWorld | undefined;
let s3: S3rver | undefined;
beforeAll(async () => {
  if (missing) return;
  world = new ClusterWorld({
    nsPrefix: "aclm",
    nodes: 2,
    gatewayPort: 18280,
    schedulerPort: 19290,
    nodePort: 18201,
    nodeRestartMs: NODE_RESTART_MS,
    env: {
      AENV__pool__low_watermark: "1",
      AENV__pool__high_watermark: "2",
      AENV__pool__restore__low_watermark: "0",
      AENV__pool__restore__high_watermark: "0",
      AENV__scheduler__rebind_after_secs: String(REBIND_AFTER_SECS),
    },
  });
  s3 = await S3rver.start({ bucket: "snapshots", netns: world.ns });
  await world.up({
    AENV__snapshot__s3__bucket: s3.bucket,
    AENV__snapshot__s3__endpoint: s3.endpoint,
    AENV__snapshot__s3__prefix: PREFIX,
    AENV__snapshot__s3__push_kinds: "template,user,pause",
    AENV_SNAPSHOT_S3_ACCESS_KEY_ID: S3RVER_KEY,
    AENV_SNAPSHOT_S3_SECRET_ACCESS_KEY: S3RVER_KEY,
  });
}, 180_000);
afterAll(async () => {
  await world?.dispose();
  await s3?.stop();
}, 120_000);

type Created = { id: string; proof: string; node: string };
type Connected = { proof: string; counts: [number, number]; node: string; errors: number; firstError: string | null };
type Got = { status: number; node: string | null; state: string | null; message: string };

test("cluster: a restarted node's paused sandbox routes again; a node gone for good: its paused sandbox resumes on the other node from the shared store; the node that comes back drops its copy", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  const w = world!;
  const store = s3!;
  const t0 = performance.now();
  const steps: Record<string, number> = {};
  const step = (name: string) => (steps[name] = Math.round(performance.now() - t0));

  const c = await w.client<Created>("cluster-moves.ts", ["create"]);
  const home = c.node as "node-a" | "node-b";
  const other = home === "node-a" ? "node-b" : "node-a";
  expect(c.id).toMatch(/^[a-z0-9]+$/);
  step("created+paused");

  // 1. its node killed and restarted by cluster up on the same data dir
  const mark = w.out.length;
  const lock = w.holdNodeLock(home);
  process.kill(w.pid(home), "SIGKILL");
  await lock.held;
  await w.waitFor(new RegExp(`cluster: ${home} exited \\(SIGKILL\\)`), 10_000, mark);
  const down = await w.client<Got>("cluster-moves.ts", ["get", c.id]);
  expect(down.status).toBe(502);
  expect(down.message).toContain(`node ${home} (`);
  await lock.release();
  await w.waitFor(new RegExp(`node ${home} pid \\d+`), 2 * NODE_RESTART_MS + 60_000, mark);
  step("restarted");
  const again = await w.client<Connected>("cluster-moves.ts", ["connect", c.id, "pause", "30000"]);
  expect(again.node).toBe(home);
  expect(again.proof).toBe(c.proof);
  expect(again.counts[1]).toBeGreaterThan(again.counts[0]);
  step("connected at home, paused again");

  // its pause is in the store with the sandbox's record
  const record = store.objectPath(`${PREFIX}sandboxes/${c.id}.json`);
  await store.settled();
  await waitForFile(record);
  const pauseId = (JSON.parse(await Bun.file(record).text()) as { snapshotId: string }).snapshotId;
  expect(existsSync(store.objectPath(`${PREFIX}manifests/${pauseId}.json`))).toBe(true);

  // 2. its node killed and kept down: the connect moves the sandbox once the node is gone
  const mark2 = w.out.length;
  const lock2 = w.holdNodeLock(home);
  process.kill(w.pid(home), "SIGKILL");
  await lock2.held;
  await w.waitFor(new RegExp(`cluster: ${home} exited \\(SIGKILL\\)`), 10_000, mark2);
  step("killed for good");
  const moved = await w.client<Connected>("cluster-moves.ts", ["connect", c.id, "", String(REBIND_AFTER_SECS * 1000 + 60_000)]);
  step("moved");
  expect(moved.node).toBe(other);
  expect(moved.proof).toBe(c.proof);
  // the counter goes on from where the pause left it: memory restored, not a cold boot
  expect(moved.counts[0]).toBeGreaterThanOrEqual(again.counts[1]);
  expect(moved.counts[1]).toBeGreaterThan(moved.counts[0]);
  // refused while the node might only be restarting
  expect(moved.errors).toBeGreaterThan(0);
  expect(moved.firstError).toContain(home);
  // running again: no pause of it stays in the store
  await store.settled();
  await waitForGone(record);
  expect(existsSync(store.objectPath(`${PREFIX}manifests/${pauseId}.json`))).toBe(false);

  // 3. the node comes back: told the sandbox is the other node's, it drops its copy
  await lock2.release();
  await w.waitFor(new RegExp(`node ${home} pid \\d+`), 2 * NODE_RESTART_MS + 60_000, mark2);
  const gone = await w.client<Got>("cluster-moves.ts", ["node-get", w.nodes[home]!, c.id, "404"]);
  expect(gone.status).toBe(404);
  step("dropped at home");
  const now = await w.client<Got>("cluster-moves.ts", ["get", c.id]);
  expect([now.status, now.node, now.state]).toEqual([200, other, "running"]);
  const last = await w.client<Connected>("cluster-moves.ts", ["connect", c.id]);
  expect([last.node, last.proof, last.errors]).toEqual([other, c.proof, 0]);
  expect(last.counts[0]).toBeGreaterThan(moved.counts[1]);
  console.log(`cluster moves e2e steps (ms since start): ${JSON.stringify(steps)}; connect attempts before the move: ${moved.errors}`);
}, 900_000);

/** Wait (bounded) until s3rver has the object file at `path`. */
function waitForFile(path: string): Promise<unknown> {
  return waitFor(`the object ${path}`, () => existsSync(path), { timeoutMs: 120_000 });
}

/** Wait (bounded) until s3rver no longer has the object file at `path`. */
function waitForGone(path: string): Promise<unknown> {
  return waitFor(`the object ${path} to go`, () => !existsSync(path), { timeoutMs: 60_000 });
}
