/**
 * The VM runtime's start-up recovery over a real snapshot repository and SQLite file (no VM
 * boots: its network manager and disk daemon are never started, nothing is adopted), as the
 * orchestrator's start runs it on the stored records: pause snapshots go only when no paused sandbox's stored state names them,
 * and a paused sandbox whose stored state does not parse keeps its own (never data lost to a
 * damaged record). Also what template garbage collection keeps for live sandboxes
 * (`sandboxLayers`), which parses the same state.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { openDb } from "../../src/db/index.ts";
import { sandboxLayers } from "../../src/node/templates.ts";
import { Orchestrator, orchestratorConfig, type ReapReport, type SandboxRecord, type SandboxState } from "../../src/orchestrator/index.ts";
import { SandboxStore } from "../../src/orchestrator/store.ts";
import type { VmState } from "../../src/sandbox/index.ts";
import { idleVmRuntime } from "../helpers/vm-runtime.ts";
import { commitFake } from "../snapshot/helpers.ts";

const home = mkdtempSync(join(tmpdir(), "aenv-reap-"));
const cfg = loadConfig({ env: { AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run"), AENV__snapshot__gc_grace_secs: "0" } });
const db = openDb(join(home, "node.db"));
const { runtime, repo } = idleVmRuntime(cfg, db);
const orch = new Orchestrator(db, runtime, orchestratorConfig(cfg));
afterAll(async () => {
  await orch.close(); // closes the runtime
  db.close();
  rmSync(home, { recursive: true, force: true });
});

/** A stored sandbox record in `state` with runtime state `runtimeState`. */
function record(id: string, state: SandboxState, runtimeState: unknown): SandboxRecord {
  const t = Date.now();
  return {
    id, templateId: "base", alias: null, state, cpuCount: 1, memoryMB: 512, diskSizeMB: 2048, envdVersion: "0.6.4", envdAccessToken: null, trafficAccessToken: null, metadata: {}, envVars: {},
    autoPause: false, autoPauseMemory: true, autoResume: false, snapshotKind: state === "paused" ? "memory" : null, allowInternetAccess: null, network: null, volumeMounts: [], endpoint: null,
    runtimeState, error: null, createdAt: t, startedAt: t, endAt: t + 3_600_000, updatedAt: t,
  };
}

/** A paused sandbox's stored state naming pause snapshot `paused`. */
function pausedState(paused: string, rootLayers: string[] = ["/t/base.layer"]): VmState {
  return {
    workDir: "/w/s", rootDisk: "", mac: "02:fc:00:00:00:01", base: "abcdefghij0123456789", coldBoot: false, paused,
    vcpus: 1, memoryMiB: 512, envdToken: null, envdVersion: "0.6.4", template: { rootLayers, boot: null },
  };
}

test("start-up reap: a pause snapshot goes only when no paused sandbox names it; a damaged paused record keeps its own", async () => {
  // layers are content-addressed: each snapshot gets layers of its own
  const pause = (sandboxId: string, tag: string) => commitFake(repo, { kind: "pause", sandboxId, disk: [`disk-${tag}`], memory: [`mem-${tag}`] });
  const named = pause("good", "named");
  const stale = pause("good", "stale"); // an older pause of the same sandbox
  const ofDamaged = pause("damaged", "damaged");
  const ofNull = pause("nostate", "null");
  const ofUnnamed = pause("unnamed", "unnamed");
  const ofRunning = pause("wasrunning", "running");
  const user = commitFake(repo, { kind: "user", sandboxId: "wasrunning", names: ["keep"], disk: ["disk-user"], memory: ["mem-user"] });
  const { paused: _, ...noPause } = pausedState(named.id);
  const store = new SandboxStore(db);
  const stored = (id: string, state: SandboxState, runtimeState: unknown) => store.insert(record(id, state, runtimeState));
  stored("good", "paused", { ...pausedState(named.id), version: 1 });
  // the paused field damaged (the case that removed a paused sandbox's only snapshot before)
  stored("damaged", "paused", { ...pausedState(ofDamaged.id), paused: 7 });
  stored("nostate", "paused", null);
  stored("unnamed", "paused", noPause);
  stored("wasrunning", "running", { ...pausedState(ofRunning.id) });
  // the real reap, its report kept
  const reports: ReapReport<VmState>[] = [];
  const recover = runtime.recover.bind(runtime);
  runtime.recover = async (known) => {
    reports.push(await recover(known));
    return reports.at(-1)!;
  };
  await orch.start();
  expect(reports).toHaveLength(1);
  const report = reports[0]!;
  expect(["good", "damaged", "nostate", "unnamed", "wasrunning"].map((id) => store.get(id)!.state)).toEqual(["paused", "paused", "paused", "paused", "killed"]);
  const left = repo.list({ hidden: true }).map((m) => m.id);
  expect(left.sort()).toEqual([named.id, ofDamaged.id, ofNull.id, ofUnnamed.id, user.id].sort());
  expect(report.removed.filter((r) => r.startsWith("snapshot ")).sort()).toEqual([`snapshot ${stale.id} (pause)`, `snapshot ${ofRunning.id} (pause)`].sort());
  // the kept snapshots' layers stay; the removed ones' are collected
  const layers = (m: typeof named) => [...m.disk.layers, ...m.memory!.layers, m.vmState!];
  for (const m of [named, ofDamaged, ofNull, ofUnnamed, user]) for (const l of layers(m)) expect(repo.hasLayer(l)).toBe(true);
  for (const m of [stale, ofRunning]) for (const l of layers(m)) expect(repo.hasLayer(l)).toBe(false);
});

test("template layers pinned by live sandboxes come from their parsed state; a damaged one makes garbage collection refuse", () => {
  const rec = (id: string, runtimeState: unknown) => ({ id, runtimeState }) as SandboxRecord;
  const live = (records: SandboxRecord[]) => ({ inStates: () => records });
  expect(sandboxLayers(live([rec("a", pausedState("zzzzzzzzzz0123456789", ["/t/a.layer", "/t/b.layer"])), rec("b", null), rec("c", pausedState("yyyyyyyyyy0123456789", []))]))).toEqual([
    "/t/a.layer",
    "/t/b.layer",
  ]);
  const damaged = live([rec("a", pausedState("zzzzzzzzzz0123456789")), rec("d", { ...pausedState("yyyyyyyyyy0123456789"), template: { rootLayers: "/t/x.layer", boot: null } })]);
  expect(() => sandboxLayers(damaged)).toThrow(expect.objectContaining({ code: "orchestrator.bad_runtime_state", details: expect.objectContaining({ sandboxId: "d", field: "/template/rootLayers" }) }));
});
