import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openDb } from "../../src/db/index.ts";
import { SandboxStore } from "../../src/orchestrator/store.ts";
import { decodeCursor, encodeCursor } from "../../src/orchestrator/pages.ts";
import { newSandboxId, SANDBOX_ID_RE } from "../../src/orchestrator/ids.ts";
import type { SandboxRecord } from "../../src/orchestrator/types.ts";
import type { SandboxState } from "../../src/orchestrator/states.ts";

function rec(id: string, state: SandboxState, startedAt: number, metadata: Record<string, string> = {}): SandboxRecord {
  return {
    id, templateId: "base", alias: null, state, cpuCount: 1, memoryMB: 512, diskSizeMB: 2048, envdVersion: "0.5.7",
    envdAccessToken: "t", trafficAccessToken: null, metadata, envVars: { A: "1" }, autoPause: false, autoPauseMemory: true, autoResume: false,
    snapshotKind: null, allowInternetAccess: null, network: null, volumeMounts: [], endpoint: { host: "127.0.0.1" }, runtimeState: { pid: 1 },
    error: null, createdAt: startedAt, startedAt, endAt: startedAt + 1000, updatedAt: startedAt,
  };
}

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function tempDb() {
  const d = mkdtempSync(join(tmpdir(), "orch-store-"));
  dirs.push(d);
  return join(d, "node.db");
}

test("records round-trip through SQLite, JSON columns included, and survive reopening", () => {
  const file = tempDb();
  const db = openDb(file);
  const s = new SandboxStore(db);
  const r = rec("aaa", "running", 1000, { user: "a b" });
  s.insert(r);
  s.update("aaa", { state: "paused", endpoint: null }, 5000);
  db.close();
  const again = new SandboxStore(openDb(file));
  expect(again.get("aaa")).toEqual({ ...r, state: "paused", endpoint: null, updatedAt: 5000 });
  expect(again.get("nope")).toBeUndefined();
});

test("pages follow (startedAt, id) order in both directions with metadata filtering across batches", () => {
  const s = new SandboxStore(openDb(":memory:"));
  // 150 sandboxes; every third one has team=x; two share a start time to exercise the id tie-break
  for (let i = 0; i < 150; i++) s.insert(rec(`s${String(i).padStart(3, "0")}`, i % 10 === 9 ? "paused" : "running", 1000 + Math.floor(i / 2), i % 3 === 0 ? { team: "x" } : {}));
  s.insert(rec("zkilled", "killed", 1000, { team: "x" }));
  const keep = (r: SandboxRecord) => r.metadata.team === "x";
  const seen: string[] = [];
  let cursor: { startedAt: number; id: string } | undefined;
  for (let pages = 0; pages < 20; pages++) {
    const p = s.page({ states: ["running", "paused"], order: "asc", limit: 7, cursor, keep });
    seen.push(...p.items.map((r) => r.id));
    if (!p.more) break;
    const last = p.items[p.items.length - 1]!;
    cursor = { startedAt: last.startedAt, id: last.id };
  }
  const want = Array.from({ length: 150 }, (_, i) => i).filter((i) => i % 3 === 0).map((i) => `s${String(i).padStart(3, "0")}`);
  expect(seen).toEqual(want);
  const desc = s.page({ states: ["paused"], order: "desc", limit: 3, keep: () => true });
  expect(desc.items.map((r) => r.id)).toEqual(["s149", "s139", "s129"]);
  expect(desc.more).toBe(true);
  expect(s.page({ states: ["running"], order: "asc", limit: 100, template: "other", keep: () => true }).items).toEqual([]);
  // inclusive (E2B: "started at or after"): s146 and s147 started exactly at 1073
  expect(s.page({ states: ["running"], order: "asc", limit: 100, startedAfter: 1073, keep: () => true }).items.map((r) => r.id)).toEqual(["s146", "s147", "s148"]);
});

test("expired() lists running sandboxes past endAt; prune() drops old killed rows only", () => {
  const s = new SandboxStore(openDb(":memory:"));
  s.insert({ ...rec("r1", "running", 0), endAt: 100, autoPause: true, autoPauseMemory: false });
  s.insert({ ...rec("r2", "running", 0), endAt: 300 });
  s.insert({ ...rec("p1", "paused", 0), endAt: 50 });
  s.insert({ ...rec("k1", "killed", 0), updatedAt: 10 });
  s.insert({ ...rec("k2", "killed", 0), updatedAt: 500 });
  expect(s.expired(200)).toEqual([{ id: "r1", autoPause: true, autoPauseMemory: false }]);
  expect(s.prune(100)).toBe(1);
  expect(s.get("k1")).toBeUndefined();
  expect(s.get("k2")?.state).toBe("killed");
  expect(s.countByState()).toEqual({ running: 2, paused: 1, killed: 1 });
});

test("cursor tokens round-trip and malformed ones are a 400", () => {
  const tok = encodeCursor({ startedAt: 1732870000123, id: "abc123" });
  expect(decodeCursor(tok)).toEqual({ startedAt: 1732870000123, id: "abc123" });
  for (const bad of ["", "!!!", Buffer.from("12:ABC").toString("base64url"), Buffer.from("x:abc").toString("base64url")]) {
    expect(() => decodeCursor(bad)).toThrow(expect.objectContaining({ code: "orchestrator.bad_request" }));
  }
});

test("sandbox ids are 20 lowercase alphanumerics and distinct", () => {
  const ids = new Set(Array.from({ length: 1000 }, newSandboxId));
  expect(ids.size).toBe(1000);
  for (const id of ids) {
    expect(id).toMatch(/^[a-z0-9]{20}$/);
    expect(SANDBOX_ID_RE.test(id)).toBe(true);
  }
});

test("template spawn statistics count each spawn, keep the latest time, and survive reopening", () => {
  const file = tempDb();
  const db = openDb(file);
  const s = new SandboxStore(db);
  expect(s.spawnStats().size).toBe(0);
  s.recordSpawn("base", 1000);
  s.recordSpawn("base", 3000);
  s.recordSpawn("other", 2000);
  db.close();
  const again = openDb(file);
  const stats = new SandboxStore(again).spawnStats();
  expect(Object.fromEntries(stats)).toEqual({ base: { spawnCount: 2, lastSpawnedAt: 3000 }, other: { spawnCount: 1, lastSpawnedAt: 2000 } });
  new SandboxStore(again).recordSpawn("base", 4000);
  expect(new SandboxStore(again).spawnStats().get("base")).toEqual({ spawnCount: 3, lastSpawnedAt: 4000 });
  again.close();
});
