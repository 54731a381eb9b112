/**
 * The S3 snapshot repository end to end: `agentenv server` in a private namespace with
 * `[snapshot.s3]` pointing at a real S3 server (s3rver, started by this test inside the same
 * namespace on 127.0.0.1 and killed after), the unmodified e2b SDK, real QEMU VMs.
 * A sandbox writes a file and is snapshotted (createSnapshot); the node pushes the snapshot (and
 * the base template's, at its start-up sync) and finishes the pushes at shutdown; the node's
 * whole local repository is deleted; the restarted node restores `Sandbox.create(snapshotId)`
 * from S3 (manifest adopted, every layer fetched and digest-checked) and the sandbox sees the file.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { S3rver, S3RVER_KEY } from "../helpers/s3rver.ts";
import { NodeWorld, vmPrerequisites } from "./world.ts";

const missing = vmPrerequisites();
let world: NodeWorld | undefined;
let s3: S3rver | undefined;
const PREFIX = "e2e/";

function nodeEnv(): Record<string, string> {
  return {
    AENV__snapshot__s3__bucket: s3!.bucket,
    AENV__snapshot__s3__endpoint: s3!.endpoint,
    AENV__snapshot__s3__prefix: PREFIX,
    AENV_SNAPSHOT_S3_ACCESS_KEY_ID: S3RVER_KEY,
    AENV_SNAPSHOT_S3_SECRET_ACCESS_KEY: S3RVER_KEY,
    AENV__snapshot__s3__shutdown_wait_ms: "600000",
  };
}

beforeAll(async () => {
  if (missing) return;
  world = new NodeWorld();
  // in the node's namespace: the node reaches it on its own loopback
  s3 = await S3rver.start({ bucket: "snapshots", netns: world.ns });
  await world.start(nodeEnv());
}, 120_000);

afterAll(async () => {
  await world?.dispose();
  await s3?.stop();
}, 120_000);

type Ref = { digest: string; size: number };
type Manifest = { id: string; kind: string; disk: { layers: Ref[] }; memory: { layers: Ref[] } | null; vmState: Ref | null; tools?: Ref };
const layersOf = (m: Manifest): Ref[] => [...new Map([...m.disk.layers, ...(m.memory?.layers ?? []), ...(m.vmState ? [m.vmState] : []), ...(m.tools ? [m.tools] : [])].map((l) => [l.digest, l])).values()];

test("a snapshot pushed to S3 is restored by a node whose local repository was deleted, and sees the file written before it", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  const w = world!;
  const store = s3!;
  const p1 = await w.client<{ snapshotId: string; proof: string }>("s3-snapshot-phase1.ts", [], 400_000);
  expect(p1.snapshotId).toMatch(/^[a-z0-9]{20}$/);
  // a graceful stop finishes the pushes in progress
  expect(await w.stop()).toBe(0);

  // the store holds the manifest and every layer it names, byte-exact
  await store.settled();
  const local = JSON.parse(readFileSync(join(w.home, "snapshots", "manifests", `${p1.snapshotId}.json`), "utf8")) as Manifest;
  const remotePath = store.objectPath(`${PREFIX}manifests/${p1.snapshotId}.json`);
  expect(JSON.parse(readFileSync(remotePath, "utf8"))).toEqual(local);
  const layers = layersOf(local);
  expect(layers.length).toBeGreaterThanOrEqual(4); // disk layers + memory + VMM state + tools drive
  for (const l of layers) expect(statSync(store.objectPath(`${PREFIX}layers/sha256/${l.digest.slice(7)}`)).size).toBe(l.size);
  // the base template's snapshot went up at the node's start-up sync
  const tpl = JSON.parse(readFileSync(join(w.home, "templates", "base", "manifest.json"), "utf8")).snapshot as string;
  expect(existsSync(store.objectPath(`${PREFIX}manifests/${tpl}.json`))).toBe(true);

  // delete the node's whole local repository, then start it again
  rmSync(join(w.home, "snapshots"), { recursive: true, force: true });
  await w.start(nodeEnv());
  const p2 = await w.client<{ proof: string; stdout: string; exitCode: number; createMs: number }>("s3-snapshot-phase2.ts", [p1.snapshotId], 600_000);
  expect(p2.proof).toBe(p1.proof);
  expect([p2.stdout, p2.exitCode]).toEqual([`${p1.proof}ok\n`, 0]);

  // the manifest was adopted and every layer fetched into the local repository, each equal to its digest
  const root = join(w.home, "snapshots");
  expect(JSON.parse(readFileSync(join(root, "manifests", `${p1.snapshotId}.json`), "utf8"))).toEqual(local);
  expect(existsSync(join(root, "remote", p1.snapshotId))).toBe(true);
  const present = new Set(readdirSync(join(root, "layers")));
  for (const l of layers) {
    expect(present.has(l.digest.slice(7))).toBe(true);
    const hash = new Bun.CryptoHasher("sha256");
    for await (const chunk of Bun.file(join(root, "layers", l.digest.slice(7))).stream()) hash.update(chunk);
    expect(`sha256:${hash.digest("hex")}`).toBe(l.digest);
  }
  console.log(`S3 restore: ${layers.length} layers, ${(layers.reduce((a, l) => a + l.size, 0) / 1048576).toFixed(0)} MiB fetched; Sandbox.create(snapshotId) took ${p2.createMs} ms`);
}, 900_000);
