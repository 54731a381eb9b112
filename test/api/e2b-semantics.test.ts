/**
 * E2B semantics the node used to differ on (issue 29), through the unmodified e2b@2.51.0 SDK
 * against a real node (SQLite, orchestrator, API; sandboxes are loopback guests): list order
 * (E2B's spec and SDK: newest first unless `order: "asc"`) and `startedAfter` (at or after).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { Sandbox } from "e2b";
import { startNodeNoVm, type TestNode } from "./helpers.ts";

let node: TestNode;
let opts: { apiUrl: string; apiKey: string; sandboxUrl: string };
const ids: string[] = [];

beforeAll(async () => {
  node = await startNodeNoVm({}, undefined, { templates: ["base"] });
  opts = { apiUrl: node.url, apiKey: node.apiKey, sandboxUrl: node.url };
  for (let i = 0; i < 3; i++) {
    // one start time per millisecond at least: the order is by start time
    const t = Date.now();
    while (Date.now() === t) await Bun.sleep(1);
    ids.push((await Sandbox.create("base", { ...opts, metadata: { suite: "semantics" } })).sandboxId);
  }
});

afterAll(async () => {
  for (const id of ids) await Sandbox.kill(id, opts);
  await node.dispose();
});

test("Sandbox.list() is newest first by default (E2B spec: order defaults to desc), oldest first with order asc, across pages", async () => {
  const [a, b, c] = ids as [string, string, string];
  const q = { query: { metadata: { suite: "semantics" } } };
  expect((await Sandbox.list({ ...opts, ...q }).nextItems()).map((s) => s.sandboxId)).toEqual([c, b, a]);
  expect((await Sandbox.list({ ...opts, ...q, order: "asc" }).nextItems()).map((s) => s.sandboxId)).toEqual([a, b, c]);
  const pages: string[][] = [];
  const p = Sandbox.list({ ...opts, ...q, limit: 2 });
  while (p.hasNext) pages.push((await p.nextItems()).map((s) => s.sandboxId));
  expect(pages).toEqual([[c, b], [a]]);
});

test("startedAfter is inclusive: the sandbox started exactly at that time is listed", async () => {
  const [, b, c] = ids as [string, string, string];
  const listed = await Sandbox.list({ ...opts, query: { metadata: { suite: "semantics" } } }).nextItems();
  const at = listed.find((s) => s.sandboxId === b)!.startedAt;
  const after = await Sandbox.list({ ...opts, order: "asc", query: { metadata: { suite: "semantics" }, startedAfter: at } }).nextItems();
  expect(after.map((s) => s.sandboxId)).toEqual([b, c]);
  // one millisecond later leaves it out
  const later = await Sandbox.list({ ...opts, order: "asc", query: { metadata: { suite: "semantics" }, startedAfter: new Date(at.getTime() + 1) } }).nextItems();
  expect(later.map((s) => s.sandboxId)).toEqual([c]);
});
