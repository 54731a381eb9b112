/**
 * Per-sandbox vCPUs and memory without booting: the template's manifest sets them, a create may
 * override them, the node's limits refuse oversize asks with a 400 naming the limit, and the
 * runtime is asked for exactly the resulting sizes (its start is replaced by a recorder here; the
 * guest's own view, nproc and /proc/meminfo, is checked in test/e2e/parity.test.ts).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { writeManifest } from "../../src/template/index.ts";
import type { RuntimeStartSpec } from "../../src/orchestrator/index.ts";
import { api, startNodeNoVm, type TestNode } from "./helpers.ts";

let node: TestNode;
const started: RuntimeStartSpec[] = [];

function template(name: string, extra: { cpuCount?: number; memoryMB?: number }) {
  const dir = join(node.home, "templates", name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "rootfs.ext4"), Buffer.alloc(0));
  writeManifest(node.home, { name, rootfs: "rootfs.ext4", layers: [], bootArgs: "", diskBytes: 1 << 30, buildKey: "k", createdAt: "2026-11-29T10:00:00.000Z", ...extra });
}

beforeAll(async () => {
  node = await startNodeNoVm({ AENV__orchestrator__max_cpu_count: "4", AENV__orchestrator__max_memory_mb: "2048" });
  node.orch.runtime.start = async (spec) => {
    started.push(spec);
    throw new Error("no VM in this test");
  };
  template("small", {});
  template("big", { cpuCount: 2, memoryMB: 1024 });
  template("huge", { cpuCount: 6, memoryMB: 1024 });
});
afterAll(async () => {
  await node.dispose();
});

async function create(body: Record<string, unknown>): Promise<{ status: number; body: any }> {
  const r = await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

test("templates list their vCPUs and memory (manifest, else the node's defaults)", async () => {
  const list = (await (await api(node, "/templates")).json()) as any[];
  const by = Object.fromEntries(list.map((t) => [t.templateID, [t.cpuCount, t.memoryMB]]));
  expect(by).toEqual({ big: [2, 1024], huge: [6, 1024], small: [1, 512] });
});

test("the runtime boots the template's sizes, or the request's cpuCount / memoryMB", async () => {
  started.length = 0;
  // the recorder fails the boot: the create answers 500 after the runtime saw the spec
  expect((await create({ templateID: "big" })).status).toBe(500);
  expect((await create({ templateID: "big", cpuCount: 4 })).status).toBe(500);
  expect((await create({ templateID: "small", memoryMB: 2048 })).status).toBe(500);
  expect((await create({ templateID: "small", cpuCount: 3, memoryMB: 768 })).status).toBe(500);
  // v1 create takes them too
  expect((await api(node, "/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "huge", cpuCount: 1, memoryMB: 128 }) })).status).toBe(500);
  expect(started.map((s) => [s.template.templateID, s.cpuCount, s.memoryMB])).toEqual([
    ["big", 2, 1024],
    ["big", 4, 1024],
    ["small", 1, 2048],
    ["small", 3, 768],
    ["huge", 1, 128],
  ]);
});

test("oversize or malformed sizes are refused with a 400 naming the limit, before anything boots", async () => {
  started.length = 0;
  const cpu = await create({ templateID: "small", cpuCount: 5 });
  expect(cpu.status).toBe(400);
  expect(cpu.body).toEqual({ code: 400, message: "cpuCount 5 (requested) is outside 1..4, this node's limit [orchestrator] max_cpu_count", error_code: "orchestrator.bad_request" });
  const mem = await create({ templateID: "small", memoryMB: 4096 });
  expect(mem.status).toBe(400);
  expect(mem.body.message).toBe("memoryMB 4096 (requested) is outside 128..2048, this node's limit [orchestrator] max_memory_mb");
  // a template above the limit cannot be booted as it is, but an override within it can
  const tpl = await create({ templateID: "huge" });
  expect(tpl.status).toBe(400);
  expect(tpl.body.message).toBe("cpuCount 6 (template's) is outside 1..4, this node's limit [orchestrator] max_cpu_count");
  for (const bad of [{ cpuCount: 0 }, { cpuCount: 1.5 }, { cpuCount: "2" }, { memoryMB: 64 }, { memoryMB: null }]) {
    const r = await create({ templateID: "small", ...bad });
    expect([JSON.stringify(bad), r.status, r.body.code]).toEqual([JSON.stringify(bad), 400, 400]);
  }
  expect(started).toEqual([]);
  // nothing was left behind by the refusals
  expect(node.orch.store.countByState()).toEqual({ failed: 5 });
});
