/**
 * Paused sandboxes in a shared S3 store (s3rver, started here on 127.0.0.1 and killed after),
 * between two "nodes" (local repositories sharing one prefix): a pushed pause snapshot that
 * carries its sandbox's record is named by `sandboxes/<id>.json` once its manifest is stored;
 * another node finds it by sandbox id; a resume takes the store's copy away and keeps the local
 * one (never pushed again); a node that lets a sandbox go to another leaves the store's copy; a
 * kill removes both; an older pause never removes the record of a newer one; a record that does
 * not fit this node's state is refused and leaves the store's copy.
 */
import { afterAll, afterEach, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { S3Client } from "bun";
import { loadConfig } from "../../src/config/index.ts";
import { openRepository, parseManifest, snapshotConfig, type OpenedRepository } from "../../src/snapshot/index.ts";
import { SharedPauses } from "../../src/sandbox/shared-pauses.ts";
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

type Node = OpenedRepository & { remote: NonNullable<OpenedRepository["remote"]> };

/** A node with its own local repository over the store's `prefix`, pushing pause snapshots. */
function node(prefix: string): Node {
  const d = mkdtempSync(join(tmpdir(), "snappaused-"));
  dirs.push(d);
  const cfg = loadConfig({
    env: {},
    tree: { home_path: d, snapshot: { gc_grace_secs: 0, s3: { bucket: s3.bucket, prefix, endpoint: s3.endpoint, access_key_id: S3RVER_KEY, secret_access_key: S3RVER_KEY, push_kinds: ["template", "user", "pause"] } } },
  });
  const o = openRepository(snapshotConfig(cfg), { evict: true });
  opened.push(o);
  return o as Node;
}

let n = 0;
const freshPrefix = () => `p${++n}-${Math.random().toString(36).slice(2, 8)}/`;
const client = () => new S3Client({ endpoint: s3.endpoint, bucket: s3.bucket, accessKeyId: S3RVER_KEY, secretAccessKey: S3RVER_KEY, region: "us-east-1" });
const RECORD = { record: { id: "sbxmove1", metadata: { k: "v" } }, boot: null };

async function settle(...nodes: Node[]): Promise<void> {
  for (const x of nodes) await x.remote.flush();
  await s3.settled();
}

test("a pushed pause snapshot with its sandbox's record is found by sandbox id on another node, which takes the store's copy away when it resumes it", async () => {
  const prefix = freshPrefix();
  const a = node(prefix);
  const p = commitFake(a.repo, { kind: "pause", sandboxId: "sbxmove1", sandbox: RECORD });
  // a pause snapshot without a record (volumes) is pushed but names no sandbox
  const q = commitFake(a.repo, { kind: "pause", sandboxId: "sbxvol1" });
  await settle(a);
  expect(a.remote.pushFailures).toBe(0);
  expect(await a.remote.store.listIds()).toEqual([p.id, q.id].sort());
  expect(JSON.parse(await client().file(`${prefix}sandboxes/sbxmove1.json`).text())).toEqual({ sandboxId: "sbxmove1", snapshotId: p.id });
  expect(await a.remote.store.getPaused("sbxvol1")).toBeUndefined();

  const b = node(prefix);
  expect(await b.remote.findPaused("sbxvol1")).toBeUndefined();
  expect(await b.remote.findPaused("nosuchsandbox")).toBeUndefined();
  const found = await b.remote.findPaused("sbxmove1");
  expect(found).toEqual(p);
  expect(b.repo.get(p.id)).toEqual(p);
  // b resumes it: the store's copy and the record go, b's copy stays and is never pushed again
  await b.remote.unpublish(p.id);
  await s3.settled();
  expect(await b.remote.store.listIds()).toEqual([q.id]);
  expect(await b.remote.store.getPaused("sbxmove1")).toBeUndefined();
  expect(b.repo.get(p.id)).toEqual(p);
  expect(await b.remote.sync()).toEqual([]);
  await settle(b);
  expect(await b.remote.store.listIds()).toEqual([q.id]);
  // a lets go of its copy (b holds the sandbox): the store is left alone
  await a.remote.forget(p.id);
  a.repo.remove(p.id);
  await settle(a);
  expect(await a.remote.store.listIds()).toEqual([q.id]);
});

test("a node that lets a sandbox go leaves the store's copy for the node taking it; a kill removes the snapshot and its record", async () => {
  const prefix = freshPrefix();
  const a = node(prefix);
  const p = commitFake(a.repo, { kind: "pause", sandboxId: "sbxmove1", sandbox: RECORD });
  await settle(a);
  await a.remote.forget(p.id);
  a.repo.remove(p.id);
  await settle(a);
  expect(await a.remote.store.listIds()).toEqual([p.id]);
  const b = node(prefix);
  expect((await b.remote.findPaused("sbxmove1"))?.id).toBe(p.id);
  // b kills it while paused: its snapshot and record leave the store
  b.repo.remove(p.id);
  await settle(b);
  expect(await b.remote.store.listIds()).toEqual([]);
  expect(await b.remote.store.getPaused("sbxmove1")).toBeUndefined();
});

test("a sandbox that resumed before its pause was pushed never reaches the store; an older pause's removal leaves a newer one's record", async () => {
  const prefix = freshPrefix();
  const a = node(prefix);
  const early = commitFake(a.repo, { kind: "pause", sandboxId: "sbxfast1", sandbox: RECORD });
  // resumed at once: the push queued at commit finds it local-only
  const done = a.remote.unpublish(early.id);
  await settle(a);
  await done;
  expect(await a.remote.store.listIds()).toEqual([]);
  expect(await a.remote.store.getPaused("sbxfast1")).toBeUndefined();
  expect(a.remote.pushes).toEqual([]);

  const p1 = commitFake(a.repo, { kind: "pause", sandboxId: "sbxtwice", sandbox: RECORD });
  await settle(a);
  const p2 = commitFake(a.repo, { kind: "pause", sandboxId: "sbxtwice", sandbox: RECORD });
  await settle(a);
  expect(await a.remote.store.getPaused("sbxtwice")).toBe(p2.id);
  a.repo.remove(p1.id);
  await settle(a);
  expect(await a.remote.store.listIds()).toEqual([p2.id]);
  expect(await a.remote.store.getPaused("sbxtwice")).toBe(p2.id);
});

test("a record naming a snapshot the store lacks, or malformed, finds nothing or fails typed; a manifest may carry a record only as a pause", async () => {
  const prefix = freshPrefix();
  const a = node(prefix);
  const c = client();
  await c.write(`${prefix}sandboxes/sbxghost.json`, JSON.stringify({ sandboxId: "sbxghost", snapshotId: "aaaaaaaaaaaaaaaaaaaa" }));
  await c.write(`${prefix}sandboxes/sbxbroken.json`, "{not json");
  await c.write(`${prefix}sandboxes/sbxother.json`, JSON.stringify({ sandboxId: "someoneelse", snapshotId: "aaaaaaaaaaaaaaaaaaaa" }));
  await s3.settled();
  expect(await a.remote.findPaused("sbxghost")).toBeUndefined();
  await expect(a.remote.findPaused("sbxbroken")).rejects.toMatchObject({ code: "snapshot.bad_manifest" });
  await expect(a.remote.findPaused("sbxother")).rejects.toMatchObject({ code: "snapshot.bad_manifest" });
  expect(await a.remote.findPaused("Not-An-Id")).toBeUndefined();
  const m = commitFake(a.repo, { kind: "pause", sandboxId: "sbxmove1", sandbox: RECORD });
  expect(parseManifest(m, "test")).toEqual(m);
  for (const bad of [{ ...m, kind: "user" }, { ...m, sandbox: [1] }, { ...m, sandbox: "x" }, { ...m, source: { sandboxId: null, templateId: "base" } }]) {
    expect(() => parseManifest(JSON.parse(JSON.stringify(bad)), "test")).toThrow("invalid sandbox");
  }
});

test("a pause snapshot whose carried state does not fit this node is refused typed, and the node that refused it leaves the store's copy", async () => {
  const prefix = freshPrefix();
  const a = node(prefix);
  const p = commitFake(a.repo, { kind: "pause", sandboxId: "sbxmove1", sandbox: { ...RECORD, boot: "not defaults" } });
  await settle(a);
  const b = node(prefix);
  const shared = new SharedPauses(b.remote, (id) => `/nonexistent/${id}`);
  await expect(shared.find("sbxmove1")).rejects.toMatchObject({ code: "orchestrator.bad_runtime_state", details: { sandboxId: "sbxmove1", field: "/template/boot" } });
  // b's adopted copy is local-only now: removing it leaves the store's copy and its record
  b.repo.remove(p.id);
  await settle(b);
  expect(await b.remote.store.listIds()).toEqual([p.id]);
  expect(await b.remote.store.getPaused("sbxmove1")).toBe(p.id);
  expect(await shared.find("nosuchsandbox")).toBeNull();
});
