/**
 * The S3 snapshot repository and the local layer cache against a real S3 server (s3rver, started
 * here on 127.0.0.1 with a kernel-picked port and killed after): push after commit (layers once,
 * manifest last), listing, adoption of a snapshot another node pushed, fetch with digest checks,
 * corrupt and missing objects refused with a typed error and nothing cached, LRU eviction that
 * keeps held layers and layers the store lacks, deletes reaching the store, the start-up sync,
 * store failures and bad settings.
 */
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { S3Client } from "bun";
import { loadConfig } from "../../src/config/index.ts";
import { layersOf, openRepository, S3Repository, snapshotConfig, SnapshotError, type OpenedRepository, type SnapshotConfig, type SnapshotManifest } from "../../src/snapshot/index.ts";
import { S3rver, S3RVER_KEY } from "../helpers/s3rver.ts";
import { commitFake } from "./helpers.ts";

let s3: S3rver;
beforeAll(async () => {
  s3 = await S3rver.start({ bucket: "snapshots" });
});
afterAll(async () => {
  await s3?.stop();
});

const dirs: string[] = [];
const opened: OpenedRepository[] = [];
afterEach(async () => {
  for (const o of opened.splice(0)) await o.remote?.close(10_000);
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

let prefixN = 0;
/** Settings of one test's "node": its own local dir; `prefix` shares a store between nodes. */
function settings(prefix: string, over: Record<string, unknown> = {}, top: Record<string, unknown> = {}): SnapshotConfig {
  const d = mkdtempSync(join(tmpdir(), "snaps3-"));
  dirs.push(d);
  const cfg = loadConfig({
    env: {},
    tree: {
      home_path: d,
      snapshot: { gc_grace_secs: 0, ...top, s3: { bucket: s3.bucket, prefix, endpoint: s3.endpoint, access_key_id: S3RVER_KEY, secret_access_key: S3RVER_KEY, ...over } },
    },
  });
  return snapshotConfig(cfg);
}

function node(sc: SnapshotConfig, evict = true): OpenedRepository & { remote: NonNullable<OpenedRepository["remote"]> } {
  const o = openRepository(sc, { evict });
  opened.push(o);
  if (!o.remote) throw new Error("no remote configured");
  return o as OpenedRepository & { remote: NonNullable<OpenedRepository["remote"]> };
}

const freshPrefix = () => `t${++prefixN}-${Math.random().toString(36).slice(2, 8)}/`;
const client = () => new S3Client({ endpoint: s3.endpoint, bucket: s3.bucket, accessKeyId: S3RVER_KEY, secretAccessKey: S3RVER_KEY, region: "us-east-1" });
/**
 * Put other bytes under an existing key. Deleted first: s3rver answers a GET right after an
 * overwrite with an empty body now and then (about 6% here); the repository itself never
 * overwrites a key (layers are content-addressed, manifests written once).
 */
async function replaceObject(c: S3Client, key: string, body: string): Promise<void> {
  await c.delete(key);
  await c.write(key, body);
  await s3.settled();
}
/** Random text of `n` bytes (distinct layers). */
const blob = (n: number) => {
  const b = crypto.getRandomValues(new Uint8Array(n / 2));
  return Buffer.from(b).toString("hex");
};
const KiB = 1024;

describe("S3 snapshot repository (s3rver)", () => {
  test("push after commit: layers once, manifest last; listing; a second snapshot uploads only its new layers", async () => {
    const prefix = freshPrefix();
    const a = node(settings(prefix));
    const shared = blob(8 * KiB);
    const m1 = commitFake(a.repo, { kind: "user", disk: [shared, blob(4 * KiB)], memory: [blob(4 * KiB)] });
    await a.remote.flush();
    await s3.settled();
    const m2 = commitFake(a.repo, { kind: "user", disk: [shared], memory: [blob(4 * KiB)] });
    // a pause snapshot is not a pushed kind
    const p = commitFake(a.repo, { kind: "pause", memory: [blob(2 * KiB)] });
    await a.remote.flush();
    await s3.settled();
    expect(a.remote.pushFailures).toBe(0);
    expect(a.remote.pushes.map((r) => [r.id, r.layers, r.uploaded])).toEqual([
      [m1.id, 4, 4],
      [m2.id, 3, 2], // the shared disk layer was stored by the first push
    ]);
    expect(a.remote.pushes[0]!.bytes).toBe(layersOf(m1).reduce((x, l) => x + l.size, 0));
    expect(await a.remote.store.listIds()).toEqual([m1.id, m2.id].sort());
    expect(a.remote.isStored(m1.id)).toBe(true);
    expect(a.remote.isStored(p.id)).toBe(false);
    // the objects are the layer bytes and the manifest, under the prefix
    const c = client();
    for (const l of layersOf(m1)) expect(await c.file(`${prefix}layers/sha256/${l.digest.slice(7)}`).text()).toBe(readFileSync(a.repo.layerPath(l), "utf8"));
    expect(JSON.parse(await c.file(`${prefix}manifests/${m1.id}.json`).text())).toEqual(m1);
    // every key is under the prefix: manifests 2, layers 4 + 2
    const keys = (await c.list({ prefix }))?.contents?.map((o) => o.key) ?? [];
    expect(keys.length).toBe(8);
  });

  test("a node without the snapshot adopts its manifest, fetches its layers (digest-checked) and holds them", async () => {
    const prefix = freshPrefix();
    const a = node(settings(prefix));
    const m = commitFake(a.repo, { kind: "user", names: ["team/snap:v1"], disk: [blob(6 * KiB)], memory: [blob(6 * KiB)] });
    await a.remote.flush();
    await s3.settled();

    const b = node(settings(prefix));
    expect(b.repo.find(m.id)).toBeUndefined();
    expect(await b.remote.open("aaaaaaaaaaaaaaaaaaaa")).toBeUndefined(); // in neither
    const got = await b.remote.open(m.id);
    expect(got).toEqual(m);
    expect(b.repo.get(m.id)).toEqual(m);
    // the manifest is here, its layers not yet: a restore would refuse them
    for (const l of layersOf(m)) expect(b.repo.hasLayer(l)).toBe(false);
    expect(() => b.repo.verifyLayer(m.disk.layers[0]!)).toThrow(/missing/);
    const hold = await b.remote.acquire(layersOf(m));
    expect(hold.fetched.sort()).toEqual(layersOf(m).map((l) => l.digest).sort());
    expect(hold.fetchedBytes).toBe(layersOf(m).reduce((x, l) => x + l.size, 0));
    for (const l of layersOf(m)) {
      expect(readFileSync(b.repo.layerPath(l), "utf8")).toBe(readFileSync(a.repo.layerPath(l), "utf8"));
      b.repo.verifyLayer(l);
    }
    expect(b.remote.cache.held()).toEqual(layersOf(m).map((l) => l.digest).sort());
    // a second acquire fetches nothing; release twice is harmless
    const again = await b.remote.acquire(layersOf(m));
    expect(again.fetched).toEqual([]);
    again.release();
    hold.release();
    hold.release();
    expect(b.remote.cache.held()).toEqual([]);
    // nothing left in staging, and the adopted snapshot is not pushed back
    expect(readdirSync(join(b.repo.root, "staging"))).toEqual([]);
    expect(await b.remote.sync()).toEqual([]);
    await b.remote.flush();
    expect(b.remote.pushes).toEqual([]);
  });

  test("a layer larger than the part size goes up in parts and comes back byte-exact; two restores needing it at once download it once", async () => {
    const prefix = freshPrefix();
    const a = node(settings(prefix, { part_size_mib: 5, upload_concurrency: 2 }));
    const big = blob(12 * 1024 * KiB); // 12 MiB: three parts
    const m = commitFake(a.repo, { kind: "user", disk: [big], memory: [blob(KiB)] });
    await a.remote.flush();
    await s3.settled();
    expect(a.remote.pushes[0]!.bytes).toBeGreaterThan(12 * 1024 * KiB);
    const b = node(settings(prefix));
    await b.remote.open(m.id);
    const [h1, h2] = await Promise.all([b.remote.acquire(layersOf(m)), b.remote.acquire(layersOf(m))]);
    // every layer downloaded by exactly one of the two
    expect([...h1.fetched, ...h2.fetched].sort()).toEqual(layersOf(m).map((l) => l.digest).sort());
    expect(h1.fetchedBytes + h2.fetchedBytes).toBe(layersOf(m).reduce((x, l) => x + l.size, 0));
    expect(readFileSync(b.repo.layerPath(m.disk.layers[0]!), "utf8") === big).toBe(true);
    h1.release();
    expect(b.remote.cache.held().length).toBe(layersOf(m).length); // h2 still holds them
    h2.release();
    expect(b.remote.cache.held()).toEqual([]);
  });

  test("a corrupt object (same size, other bytes; or longer) is refused with snapshot.corrupt_layer and nothing is cached", async () => {
    const prefix = freshPrefix();
    const a = node(settings(prefix));
    const m = commitFake(a.repo, { kind: "user", disk: [blob(4 * KiB)], memory: [blob(4 * KiB)] });
    await a.remote.flush();
    await s3.settled();
    const c = client();
    const disk = m.disk.layers[0]!;
    const key = `${prefix}layers/sha256/${disk.digest.slice(7)}`;
    const good = await c.file(key).text();
    await replaceObject(c, key, (good[0] === "0" ? "1" : "0") + good.slice(1)); // one byte flipped

    const b = node(settings(prefix));
    await b.remote.open(m.id);
    let err: unknown;
    try {
      await b.remote.acquire(layersOf(m));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(SnapshotError);
    expect((err as SnapshotError).code).toBe("snapshot.corrupt_layer");
    expect((err as SnapshotError).details).toMatchObject({ digest: disk.digest, key });
    expect(b.repo.hasLayer(disk)).toBe(false);
    expect(readdirSync(join(b.repo.root, "staging"))).toEqual([]);
    expect(b.remote.cache.held()).toEqual([]); // the failed acquire released its hold

    await replaceObject(c, key, good + "extra");
    const e2 = await b.remote.acquire([disk]).catch((e) => e);
    expect([(e2 as SnapshotError).code, (e2 as Error).message]).toEqual(["snapshot.corrupt_layer", expect.stringContaining("more than")]);
    expect(b.repo.hasLayer(disk)).toBe(false);

    // a layer the store lost is corrupt too; with the object repaired the fetch succeeds
    await c.delete(key);
    expect(((await b.remote.acquire([disk]).catch((e) => e)) as SnapshotError).code).toBe("snapshot.corrupt_layer");
    await c.write(key, good);
    await s3.settled();
    const h = await b.remote.acquire(layersOf(m));
    expect(h.fetched.length).toBe(layersOf(m).length);
    h.release();
    expect(readdirSync(join(b.repo.root, "staging"))).toEqual([]);
  });

  test("a manifest in the store that does not parse or names another id is snapshot.bad_manifest", async () => {
    const prefix = freshPrefix();
    const b = node(settings(prefix));
    const c = client();
    await c.write(`${prefix}manifests/bbbbbbbbbbbbbbbbbbbb.json`, "{not json");
    await s3.settled();
    expect(((await b.remote.open("bbbbbbbbbbbbbbbbbbbb").catch((e) => e)) as SnapshotError).code).toBe("snapshot.bad_manifest");
    const a = node(settings(prefix));
    const m = commitFake(a.repo, { kind: "user" });
    await c.write(`${prefix}manifests/cccccccccccccccccccc.json`, JSON.stringify(m));
    await s3.settled();
    const e = (await b.remote.open("cccccccccccccccccccc").catch((x) => x)) as SnapshotError;
    expect([e.code, e.message]).toEqual(["snapshot.bad_manifest", expect.stringContaining(`names id ${m.id}`)]);
    expect(b.repo.list()).toEqual([]);
  });

  test("LRU eviction: unused layers the store holds go, least recently used first; held layers and unpushed layers stay", async () => {
    const prefix = freshPrefix();
    const a = node(settings(prefix));
    // three snapshots of 3 distinct 16 KiB layers each (48 KiB allocated per snapshot)
    const snaps = [0, 1, 2].map(() => commitFake(a.repo, { kind: "user", disk: [blob(16 * KiB)], memory: [blob(16 * KiB)] }));
    await a.remote.flush();
    await s3.settled();
    // what one snapshot's layers take on this filesystem (the cache counts allocated bytes)
    const oneSnap = layersOf(snaps[0]!).reduce((x, l) => x + statSync(a.repo.layerPath(l)).blocks * 512, 0);
    expect(oneSnap).toBeGreaterThanOrEqual(32 * KiB);
    // the node under test: room for two snapshots' layers
    const n = node({ ...settings(prefix), cacheMaxBytes: 2 * oneSnap + 1000 });
    for (const s of snaps) await n.remote.open(s.id);
    const has = (s: SnapshotManifest) => layersOf(s).map((l) => n.repo.hasLayer(l));
    const held0 = await n.remote.acquire(layersOf(snaps[0]!)); // held: a running sandbox
    const h1 = await n.remote.acquire(layersOf(snaps[1]!));
    h1.release(); // its sandbox stopped
    expect([has(snaps[0]!), has(snaps[1]!)]).toEqual([
      [true, true, true],
      [true, true, true],
    ]);
    // snapshot 2 needs room: snapshot 1 (unused) goes although snapshot 0 was used before it
    const h2 = await n.remote.acquire(layersOf(snaps[2]!));
    expect(has(snaps[0]!)).toEqual([true, true, true]);
    expect(has(snaps[1]!)).toEqual([false, false, false]);
    expect(has(snaps[2]!)).toEqual([true, true, true]);
    // everything released: snapshot 1 comes back and the least recently used (0) makes room
    held0.release();
    h2.release();
    const h1b = await n.remote.acquire(layersOf(snaps[1]!));
    expect(h1b.fetched.length).toBe(3);
    expect([has(snaps[0]!), has(snaps[1]!), has(snaps[2]!)]).toEqual([
      [false, false, false],
      [true, true, true],
      [true, true, true],
    ]);
    h1b.release();
    // the manifests stay: evicted layers are fetched again by the next acquire
    expect(n.repo.list().map((m) => m.id).sort()).toEqual(snaps.map((s) => s.id).sort());
    // a local snapshot the store lacks (a pause) is never evicted, even past the limit
    const local = commitFake(n.repo, { kind: "pause", disk: [blob(16 * KiB)], memory: [blob(16 * KiB)] });
    const big = commitFake(n.repo, { kind: "pause", disk: [blob(64 * KiB)], memory: null });
    const r = await n.remote.cache.evict();
    expect(r.overLimit).toBe(true);
    for (const l of [...layersOf(local), ...layersOf(big)]) expect(n.repo.hasLayer(l)).toBe(true);
    // what could go went: only held-by-nobody, stored layers
    expect(has(snaps[1]!).concat(has(snaps[2]!)).filter(Boolean).length).toBe(0);
  });

  test("layers younger than the grace period are not evicted (another process may be committing them)", async () => {
    const prefix = freshPrefix();
    const a = node(settings(prefix, {}, { gc_grace_secs: 3600, cache_max_bytes: 1 }));
    const m = commitFake(a.repo, { kind: "user", disk: [blob(8 * KiB)] });
    await a.remote.flush();
    await s3.settled();
    expect(a.remote.isStored(m.id)).toBe(true);
    const r = await a.remote.cache.evict();
    expect([r.layers, r.overLimit]).toEqual([[], true]);
    for (const l of layersOf(m)) expect(a.repo.hasLayer(l)).toBe(true);
    // past the grace period they go (all stored, none held)
    const later = await a.remote.cache.evict(0, Date.now() + 3601_000);
    expect(later.layers.sort()).toEqual(layersOf(m).map((l) => l.digest).sort());
    for (const l of layersOf(m)) expect(a.repo.hasLayer(l)).toBe(false);
  });

  test("a snapshot deleted here is deleted from the store; a deletion another node sees as gone", async () => {
    const prefix = freshPrefix();
    const a = node(settings(prefix));
    const m1 = commitFake(a.repo, { kind: "user" });
    const m2 = commitFake(a.repo, { kind: "user" });
    await a.remote.flush();
    await s3.settled();
    a.repo.tombstone(m1.id); // deleted by a user while a sandbox still runs from it
    a.repo.remove(m2.id);
    await a.remote.flush();
    await s3.settled();
    expect(await a.remote.store.listIds()).toEqual([]);
    const b = node(settings(prefix));
    expect(await b.remote.open(m1.id)).toBeUndefined();
    // removing a never-pushed snapshot asks nothing of the store
    const p = commitFake(a.repo, { kind: "pause" });
    a.repo.remove(p.id);
    await a.remote.flush();
    await s3.settled();
    expect(await a.remote.store.listIds()).toEqual([]);
  });

  test("sync pushes committed snapshots the store lacks (a node that committed without a store, or whose push failed)", async () => {
    const prefix = freshPrefix();
    const sc = settings(prefix);
    const offline = openRepository({ ...sc, s3: null }, { evict: true });
    expect(offline.remote).toBeNull();
    const m = commitFake(offline.repo, { kind: "template", sandboxId: null });
    const u = commitFake(offline.repo, { kind: "user" });
    commitFake(offline.repo, { kind: "fork" });
    const a = node(sc);
    expect((await a.remote.sync()).sort()).toEqual([m.id, u.id].sort());
    expect(await a.remote.sync()).toEqual([]); // queued once
    await a.remote.flush();
    await s3.settled();
    expect(await a.remote.store.listIds()).toEqual([m.id, u.id].sort());
    expect(await a.remote.sync()).toEqual([]);
  });

  test("store failures are typed: wrong credentials, missing bucket, nothing listening; the push is kept for the next sync", async () => {
    const prefix = freshPrefix();
    const bad = node(settings(prefix, { access_key_id: "WRONG", secret_access_key: "WRONG", retries: 0 }));
    const m = commitFake(bad.repo, { kind: "user" });
    await bad.remote.flush();
    expect(bad.remote.pushFailures).toBe(1);
    expect(bad.remote.isStored(m.id)).toBe(false);
    const e1 = (await bad.remote.store.listIds().catch((e) => e)) as SnapshotError;
    expect([e1.code, e1.details.status]).toEqual(["snapshot.remote_failed", "InvalidAccessKeyId"]);
    const noBucket = node(settings(prefix, { bucket: "no-such-bucket", retries: 0 }));
    const e2 = (await noBucket.remote.open("dddddddddddddddddddd").catch((e) => e)) as SnapshotError;
    expect([e2.code, e2.details.status]).toEqual(["snapshot.remote_failed", "NoSuchBucket"]);
    const down = new S3Repository({ ...settings(prefix).s3!, endpoint: "http://127.0.0.1:1", retries: 0 });
    const e3 = (await down.hasLayer({ digest: `sha256:${"0".repeat(64)}`, size: 1 }).catch((e) => e)) as SnapshotError;
    expect(e3.code).toBe("snapshot.remote_failed");
    // the same node with good credentials pushes it at its next sync
    const good = node({ ...settings(prefix), path: bad.repo.root });
    expect(await good.remote.sync()).toEqual([m.id]);
    await good.remote.flush();
    await s3.settled();
    expect(await good.remote.store.listIds()).toEqual([m.id]);
  });

  test("bad settings are refused by name", () => {
    const base = { bucket: "b-1", endpoint: "http://127.0.0.1:9000", access_key_id: "k", secret_access_key: "s" };
    const cfg = (s3: Record<string, unknown>) => loadConfig({ env: {}, tree: { home_path: "/tmp/x", snapshot: { s3: { ...base, ...s3 } } } });
    const codeOf = (f: () => unknown) => {
      try {
        f();
        return "ok";
      } catch (e) {
        return `${(e as SnapshotError).code} ${JSON.stringify((e as SnapshotError).details.key)}`;
      }
    };
    expect(codeOf(() => snapshotConfig(cfg({})))).toBe("ok");
    expect(snapshotConfig(cfg({ bucket: "" })).s3).toBeNull();
    expect(codeOf(() => snapshotConfig(cfg({ endpoint: "127.0.0.1:9000" })))).toBe('snapshot.bad_config "snapshot.s3.endpoint"');
    expect(codeOf(() => snapshotConfig(cfg({ endpoint: "ftp://host/" })))).toBe('snapshot.bad_config "snapshot.s3.endpoint"');
    expect(codeOf(() => snapshotConfig(cfg({ secret_access_key: "" })))).toBe('snapshot.bad_config "snapshot.s3.secret_access_key"');
    expect(codeOf(() => snapshotConfig(cfg({ access_key_id: "" })))).toBe('snapshot.bad_config "snapshot.s3.access_key_id"');
    expect(codeOf(() => snapshotConfig(cfg({ bucket: "Bad_Bucket" })))).toBe('snapshot.bad_config "snapshot.s3.bucket"');
    expect(codeOf(() => snapshotConfig(cfg({ push_kinds: ["user", "weekly"] })))).toBe('snapshot.bad_config "snapshot.s3.push_kinds"');
    // the schema refuses values of the wrong shape or range at load time
    expect(codeOf(() => cfg({ prefix: "/abs" }))).toBe('config.bad_value "snapshot.s3.prefix"');
    expect(codeOf(() => cfg({ prefix: "no-slash" }))).toBe('config.bad_value "snapshot.s3.prefix"');
    expect(codeOf(() => cfg({ part_size_mib: 1 }))).toBe('config.bad_value "snapshot.s3.part_size_mib"');
    expect(codeOf(() => loadConfig({ env: { AENV__snapshot__cache_max_bytes: "-1" } }))).toBe('config.bad_value "snapshot.cache_max_bytes"');
    expect(codeOf(() => cfg({ region: "" }))).toBe('config.bad_value "snapshot.s3.region"');
    // credentials from the environment, never needed in a file
    const fromEnv = snapshotConfig(loadConfig({ env: { AENV_SNAPSHOT_S3_ACCESS_KEY_ID: "id1", AENV_SNAPSHOT_S3_SECRET_ACCESS_KEY: "sec1" }, tree: { home_path: "/tmp/x", snapshot: { s3: { bucket: "b-1" } } } }));
    expect([fromEnv.s3?.accessKeyId, fromEnv.s3?.secretAccessKey, fromEnv.s3?.endpoint, fromEnv.s3?.prefix]).toEqual(["id1", "sec1", undefined, "agentenv/"]);
    expect(existsSync("/tmp/x/snapshots")).toBe(false); // reading settings touches nothing
  });
});
