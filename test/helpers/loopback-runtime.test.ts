/**
 * The loopback test runtime answers as the VM runtime where tests rely on it: a snapshot name two
 * snapshots carry resolves to the newest (a create from the name, a delete by the name), by the
 * runtime's own records (cluster tests: no repository) and through the real VmRuntime's
 * repository (node tests). Real parts: orchestrator, SQLite, the VM runtime's snapshot
 * repository (no VM boots).
 */
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { openDb } from "../../src/db/index.ts";
import { Orchestrator, orchestratorConfig } from "../../src/orchestrator/index.ts";
import { LoopbackRuntime } from "./loopback-runtime.ts";
import { idleVmRuntime } from "./vm-runtime.ts";

const cleanup: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/** An orchestrator over loopback guests; `repo`: snapshots go to the VM runtime's repository. */
function world(repo: boolean) {
  const home = mkdtempSync(join(tmpdir(), "loopback-rt-"));
  const cfg = loadConfig({ env: { AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run") } });
  const db = openDb(join(home, "node.db"));
  const vm = idleVmRuntime(cfg, db);
  const runtime = new LoopbackRuntime({ base: vm.runtime, templates: ["base"], ...(repo ? { snapshots: vm.repo } : {}) });
  const orch = new Orchestrator(db, runtime, orchestratorConfig(cfg));
  cleanup.push(() => rmSync(home, { recursive: true, force: true }), () => db.close(), () => orch.close());
  return { orch, runtime };
}

for (const repo of [false, true]) {
  test(`a name two snapshots carry: a create starts from the newest, a delete by the name removes the newest (${repo ? "VM runtime's repository" : "loopback records"})`, async () => {
    const { orch, runtime } = world(repo);
    await orch.start();
    const s = await orch.create({ template: "base", secure: true, timeoutSecs: 60 });
    const older = (await orch.createSnapshot(s.id, "twice")).snapshotID;
    const newer = (await orch.createSnapshot(s.id, "twice")).snapshotID;
    expect(older).not.toBe(newer);
    expect((await runtime.resolveTemplate("twice"))?.templateID).toBe(newer);
    const child = await orch.create({ template: "twice", secure: true, timeoutSecs: 60 });
    expect([child.templateId, runtime.started.at(-1)?.templateID]).toEqual([newer, newer]);
    // by id, each stays reachable
    expect((await runtime.resolveTemplate(older))?.templateID).toBe(older);
    expect(await runtime.snapshots.delete("twice")).toBe(true);
    expect(runtime.snapshots.list().map((x) => x.snapshotID)).toEqual([older]);
    expect((await runtime.resolveTemplate("twice"))?.templateID).toBe(older);
    await orch.kill(child.id);
    await orch.kill(s.id);
  });
}
