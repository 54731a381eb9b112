/**
 * The snapshot routes over the real node (API, orchestrator, SQLite, the snapshot repository)
 * without VMs: sandboxes are loopback guests whose snapshots commit real manifests into the
 * node's repository (test/helpers/loopback-runtime.ts), so listing, lookup and deletion are the
 * VM runtime's own. `GET /snapshots` pagination as the E2B contract defines it
 * (../shared/docs/e2b-contract.md §2.4: `limit` 1-100, `nextToken`, `X-Next-Token` only while
 * more remain), its filters, bad input; `POST /sandboxes/{id}/fork` count bounds and its one
 * result per child. Creating from a snapshot and the tree of snapshots with real VMs:
 * test/e2e/snapshot.test.ts.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { RateLimitError, Sandbox } from "e2b";
import { LocalRepository, MANIFEST_VERSION, type SnapshotManifest } from "../../src/snapshot/index.ts";
import { api, createLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";

const MAX_SANDBOXES = 3;
let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm({ AENV__orchestrator__max_sandboxes: String(MAX_SANDBOXES) }, undefined, {});
  process.env.E2B_API_URL = node.url;
  process.env.E2B_API_KEY = node.apiKey;
});
afterAll(async () => {
  await node.dispose();
});

async function json(res: Response): Promise<{ status: number; body: any; next: string | null }> {
  return { status: res.status, body: await res.json(), next: res.headers.get("x-next-token") };
}
const post = (path: string, body: unknown) => api(node, path, { method: "POST", body: JSON.stringify(body) });
const list = async (query: string) => json(await api(node, `/snapshots${query ? `?${query}` : ""}`));
const ids = (items: { snapshotID: string }[]) => items.map((s) => s.snapshotID);
const manifestsDir = () => join(node.home, "snapshots", "manifests");
const kindsInRepo = () =>
  readdirSync(manifestsDir())
    .filter((f) => f.endsWith(".json"))
    .map((f) => (JSON.parse(readFileSync(join(manifestsDir(), f), "utf8")) as SnapshotManifest).kind);

/** Every page of `query` with `limit`, following X-Next-Token: the pages' ids and the tokens seen. */
async function walk(query: string, limit: number): Promise<{ pages: string[][]; tokens: (string | null)[] }> {
  const pages: string[][] = [];
  const tokens: (string | null)[] = [];
  let token: string | null = null;
  for (let i = 0; i < 20; i++) {
    const r = await list(`${query}${query ? "&" : ""}limit=${limit}${token ? `&nextToken=${encodeURIComponent(token)}` : ""}`);
    expect(r.status).toBe(200);
    pages.push(ids(r.body));
    tokens.push(r.next);
    token = r.next;
    if (!token) return { pages, tokens };
  }
  throw new Error(`more than 20 pages for ${query}`);
}

test("GET /snapshots: oldest first in pages of `limit`, X-Next-Token only while more remain; filters sandboxID and name; the SDK's paginator walks the same pages", async () => {
  const a = await createLoopback(node);
  const b = await createLoopback(node);
  const snap = async (id: string, name?: string) => {
    const r = await json(await post(`/sandboxes/${id}/snapshots`, name ? { name } : {}));
    expect(r.status).toBe(201);
    expect(r.body).toEqual({ snapshotID: expect.stringMatching(/^[a-z0-9]{20}$/), names: name ? [name] : [] });
    return r.body.snapshotID as string;
  };
  // taken one after another: creation order is list order
  const all = [await snap(a.id, "alpha"), await snap(b.id, "beta"), await snap(a.id, "shared:v1"), await snap(b.id, "shared"), await snap(a.id)];
  expect(new Set(all).size).toBe(5);

  const whole = await list("");
  expect(whole).toMatchObject({ status: 200, next: null });
  expect(ids(whole.body)).toEqual(all);
  expect(whole.body[0]).toEqual({ snapshotID: all[0], names: ["alpha"], sandboxID: a.id, templateID: "base", createdAt: expect.stringMatching(/^\d{4}-\d\d-\d\dT/) });

  // pages: every snapshot once, in order; a token on each page but the last
  expect(await walk("", 2)).toEqual({ pages: [all.slice(0, 2), all.slice(2, 4), all.slice(4)], tokens: [expect.any(String), expect.any(String), null] });
  expect(await walk("", 4)).toEqual({ pages: [all.slice(0, 4), all.slice(4)], tokens: [expect.any(String), null] });
  // a page that holds exactly the rest carries no token (no empty last page)
  expect(await walk("", 5)).toEqual({ pages: [all], tokens: [null] });
  expect(await walk("", 1)).toEqual({ pages: all.map((s) => [s]), tokens: [...all.slice(1).map(() => expect.any(String)), null] });
  expect(await walk("", 100)).toEqual({ pages: [all], tokens: [null] });

  // filters, alone, together and with pages
  const ofA = [all[0]!, all[2]!, all[4]!];
  expect(ids((await list(`sandboxID=${a.id}`)).body)).toEqual(ofA);
  expect(ids((await list(`sandboxID=${b.id}`)).body)).toEqual([all[1]!, all[3]!]);
  expect(await walk(`sandboxID=${a.id}`, 2)).toEqual({ pages: [ofA.slice(0, 2), ofA.slice(2)], tokens: [expect.any(String), null] });
  expect(await list("sandboxID=nosuchsandbox")).toEqual({ status: 200, body: [], next: null });
  // a name matches with or without its tag; a tagged name only that tag; an id is a name too
  expect(ids((await list("name=shared")).body)).toEqual([all[2]!, all[3]!]);
  expect(ids((await list("name=shared:v1")).body)).toEqual([all[2]!]);
  expect(ids((await list("name=shared:v2")).body)).toEqual([]);
  expect(ids((await list(`name=${all[4]}`)).body)).toEqual([all[4]!]);
  expect(ids((await list(`name=shared&sandboxID=${b.id}`)).body)).toEqual([all[3]!]);
  expect(ids((await list(`name=alpha&sandboxID=${b.id}`)).body)).toEqual([]);
  expect(await walk("name=shared", 1)).toEqual({ pages: [[all[2]!], [all[3]!]], tokens: [expect.any(String), null] });

  // the SDK: hasNext follows X-Next-Token
  const p = Sandbox.listSnapshots({ limit: 2 });
  const sdkPages: string[][] = [];
  while (p.hasNext && sdkPages.length < 10) sdkPages.push((await p.nextItems()).map((s) => s.snapshotId));
  expect(sdkPages).toEqual([all.slice(0, 2), all.slice(2, 4), all.slice(4)]);
  const byName = Sandbox.listSnapshots({ name: "shared", limit: 1 });
  const named: string[][] = [];
  while (byName.hasNext && named.length < 10) named.push((await byName.nextItems()).map((s) => s.snapshotId));
  expect(named).toEqual([[all[2]!], [all[3]!]]);

  // deleting one (the SDK's way: DELETE /templates/{id}) takes it out of every page; a sandbox's
  // snapshots outlive it
  expect((await api(node, `/templates/${all[1]}`, { method: "DELETE" })).status).toBe(204);
  await node.orch.kill(a.id);
  await node.orch.kill(b.id);
  const rest = [all[0]!, ...all.slice(2)];
  expect(await walk("", 2)).toEqual({ pages: [rest.slice(0, 2), rest.slice(2)], tokens: [expect.any(String), null] });
  expect(ids((await list(`sandboxID=${a.id}`)).body)).toEqual(ofA);
  for (const s of rest) expect((await api(node, `/templates/${s}`, { method: "DELETE" })).status).toBe(204);
  expect(await list("")).toEqual({ status: 200, body: [], next: null });
});

test("GET /snapshots: snapshots committed in the same millisecond page in id order, none lost or repeated", async () => {
  // another committer of the same repository (as a template build is) writes three at one instant
  const repo = new LocalRepository(join(node.home, "snapshots"), { verifyDigests: false, gcGraceMs: 600_000 });
  const createdAt = "2026-01-02T03:04:05.678Z";
  const made: string[] = [];
  for (const id of ["0aaaaaaaaaaaaaaaaaaa", "zzzzzzzzzzzzzzzzzzzz", "m1111111111111111111"]) {
    const txn = repo.begin();
    const f = txn.file("layer");
    writeFileSync(f, id);
    const ref = txn.addLayer(f);
    const m: SnapshotManifest = {
      version: MANIFEST_VERSION,
      id,
      kind: "user",
      parent: null,
      createdAt,
      names: ["tied"],
      source: { sandboxId: "tiedsource", templateId: "base" },
      vm: { driver: "qemu", vcpus: 1, memoryMiB: 512, kernelKey: "", mac: "", bootArgs: "" },
      envd: { version: "0.5.7", accessToken: null },
      disk: { virtualSize: 1 << 30, layers: [ref] },
      memory: null,
      vmState: null,
    };
    txn.publish(m);
    made.push(id);
  }
  const sorted = [...made].sort();
  expect(await walk("sandboxID=tiedsource", 1)).toEqual({ pages: sorted.map((s) => [s]), tokens: [expect.any(String), expect.any(String), null] });
  expect(await walk("name=tied", 2)).toEqual({ pages: [sorted.slice(0, 2), sorted.slice(2)], tokens: [expect.any(String), null] });
  for (const s of made) expect((await api(node, `/templates/${s}`, { method: "DELETE" })).status).toBe(204);
});

test("GET /snapshots: a bad limit or nextToken is a 400 with the E2B error body; no key is a 401", async () => {
  const bad = (message: string) => ({ status: 400, next: null, body: { code: 400, message, error_code: "orchestrator.bad_request" } });
  expect(await list("limit=0")).toEqual(bad("limit must be between 1 and 100, got 0"));
  expect(await list("limit=101")).toEqual(bad("limit must be between 1 and 100, got 101"));
  for (const limit of ["abc", "-1", "1.5", ""]) {
    const r = await list(`limit=${limit}`);
    expect({ limit, status: r.status, code: r.body.error_code }).toEqual({ limit, status: 400, code: "api.validation" });
    expect(r.body.message).toStartWith("invalid request: ");
  }
  expect(await list("nextToken=garbage")).toEqual(bad('invalid nextToken "garbage"'));
  // base64url of something that is not "<ms>:<id>"
  const notACursor = Buffer.from("12:UPPER").toString("base64url");
  expect(await list(`nextToken=${notACursor}`)).toEqual(bad(`invalid nextToken ${JSON.stringify(notACursor)}`));
  expect((await api(node, "/snapshots", { key: null })).status).toBe(401);
});

test("fork: count 0, over 100 or not an integer is a 400 naming the bounds, and nothing is snapshotted", async () => {
  const p = await createLoopback(node);
  const calls = () => node.runtime!.calls.filter((c) => c.startsWith(`snapshot:${p.id}`));
  const refused = (count: number | string, why: string) => ({ count, status: 400, body: { code: 400, message: `invalid request: count: Expected number${why}`, error_code: "api.validation" } });
  const answers = [];
  for (const count of [0, -1, 101, 1000, 1.5, "2"]) {
    const r = await json(await post(`/sandboxes/${p.id}/fork`, { count }));
    answers.push({ count, status: r.status, body: r.body });
  }
  expect(answers).toEqual([
    refused(0, " to be greater or equal to 1"),
    refused(-1, " to be greater or equal to 1"),
    refused(101, " to be less or equal to 100"),
    refused(1000, " to be less or equal to 100"),
    refused(1.5, " to be a multiple of 1"),
    refused("2", ""),
  ]);
  // the orchestrator's own bound, as a caller inside the node meets it
  for (const count of [0, 101, 2.5]) {
    await expect(node.orch.fork(p.id, { count })).rejects.toMatchObject({ code: "orchestrator.bad_request", message: `count must be an integer between 1 and 100, got ${count}` });
  }
  expect(calls()).toEqual([]);
  expect((await json(await post("/sandboxes/nosuchsandboxaaaaaaaa/fork", { count: 1 }))).status).toBe(404);
  expect(node.orch.get(p.id).state).toBe("running");
  await node.orch.kill(p.id);
});

test("fork: one result per child in order; a child that cannot start is an error entry and the others run; the parent runs on; the checkpoint is gone", async () => {
  const parent = await createLoopback(node, { metadata: { role: "parent" }, envVars: { K: "v" }, timeoutSecs: 600 });
  const endBefore = node.orch.get(parent.id).endAt;
  // the parent holds one of the node's 3 places: two children start, the third finds the node full
  const r = await json(await post(`/sandboxes/${parent.id}/fork`, { count: 3, timeout: 30 }));
  expect(r.status).toBe(201);
  expect(r.body.length).toBe(3);
  const [c1, c2, c3] = r.body;
  for (const c of [c1, c2]) {
    expect(Object.keys(c)).toEqual(["sandbox"]);
    expect(c.sandbox).toMatchObject({ templateID: parent.templateId, envdAccessToken: expect.stringMatching(/^[0-9a-f]{64}$/) });
    const rec = node.orch.get(c.sandbox.sandboxID);
    expect(rec).toMatchObject({ state: "running", metadata: { role: "parent" }, envVars: { K: "v" } });
    expect(rec.endAt - rec.startedAt).toBe(30_000);
  }
  expect(c1.sandbox.sandboxID).not.toBe(c2.sandbox.sandboxID);
  expect(c3).toEqual({ error: { code: 429, message: `node is at its limit of ${MAX_SANDBOXES} concurrent sandboxes`, error_code: "orchestrator.capacity" } });
  // one checkpoint for all children; the parent runs on with its expiry
  expect(node.runtime!.calls.filter((c) => c.startsWith(`snapshot:${parent.id}`))).toEqual([`snapshot:${parent.id}:fork`]);
  expect(node.orch.get(parent.id)).toMatchObject({ state: "running", endAt: endBefore });
  // a fork checkpoint is never listed, and it is removed after the fork
  expect(kindsInRepo().filter((k) => k === "fork")).toEqual([]);
  expect(ids((await list(`sandboxID=${parent.id}`)).body)).toEqual([]);

  // the SDK turns the error entry into an error object beside the children it started
  await node.orch.kill(c1.sandbox.sandboxID);
  await node.orch.kill(c2.sandbox.sandboxID);
  const forks = await Sandbox.fork(parent.id, { count: 3, timeoutMs: 30_000 });
  expect(forks.map((f) => (f instanceof Error ? f.constructor.name : "Sandbox"))).toEqual(["Sandbox", "Sandbox", "RateLimitError"]);
  expect((forks[2] as RateLimitError).message).toContain(`node is at its limit of ${MAX_SANDBOXES} concurrent sandboxes`);
  for (const f of forks) if (!(f instanceof Error)) expect(node.orch.get(f.sandboxId).state).toBe("running");
  expect(kindsInRepo().filter((k) => k === "fork")).toEqual([]);
  for (const f of forks) if (!(f instanceof Error)) await node.orch.kill(f.sandboxId);
  await node.orch.kill(parent.id);
});
