/**
 * Lifecycle events (issue 29 item 3) over a real node (SQLite, orchestrator, API) whose sandboxes
 * are loopback guests, driven by the unmodified e2b@2.51.0 SDK: every transition of a sandbox is
 * one event in `GET /events/sandboxes/{id}` as E2B serves them (shape, order, filters, paging),
 * the node-wide feed follows a cursor, timeouts and failures carry their reasons, a restart keeps
 * the events and records the sandboxes it could not keep as killed (orphaned; those it adopts:
 * test/orchestrator/recovery.test.ts), and the retention scan deletes old events.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox } from "e2b";
import { loadConfig } from "../../src/config/index.ts";
import { openDb } from "../../src/db/index.ts";
import { EventsService, eventsConfig, TEAM_ID, type SandboxLifecycleEvent } from "../../src/events/index.ts";
import { Orchestrator, orchestratorConfig } from "../../src/orchestrator/index.ts";
import { LoopbackRuntime } from "../helpers/loopback-runtime.ts";
import { idleVmRuntime } from "../helpers/vm-runtime.ts";
import { api, startNodeNoVm, type TestNode } from "../api/helpers.ts";
import { waitFor } from "../helpers/wait.ts";

let node: TestNode;
let opts: { apiUrl: string; apiKey: string; sandboxUrl: string };
const GUEST = { templates: ["base"] };

beforeAll(async () => {
  node = await startNodeNoVm({ AENV__orchestrator__evict_interval_ms: "50" }, undefined, GUEST);
  opts = { apiUrl: node.url, apiKey: node.apiKey, sandboxUrl: node.url };
});

afterAll(async () => {
  await node.dispose();
});

async function events(path: string): Promise<{ status: number; body: SandboxLifecycleEvent[]; cursor: string | null }> {
  const r = await api(node, path);
  return { status: r.status, body: (await r.json()) as SandboxLifecycleEvent[], cursor: r.headers.get("x-next-cursor") };
}
const types = (es: SandboxLifecycleEvent[]) => es.map((e) => e.type.replace("sandbox.lifecycle.", ""));

/** Poll the events of `id` until one of `type` is there (bounded). */
async function until(id: string, type: string, ms = 15_000): Promise<SandboxLifecycleEvent> {
  return waitFor(`the ${type} event of ${id}`, async () => {
    const r = await events(`/events/sandboxes/${id}?orderAsc=true&limit=100`);
    return r.status === 200 ? r.body.find((x) => x.type === `sandbox.lifecycle.${type}`) : undefined;
  }, { timeoutMs: ms });
}

test("each transition of a sandbox is one E2B event, newest first, with its data; filters and paging; the node-wide feed follows a cursor", async () => {
  const head = (await events("/events/sandboxes")).cursor!;
  expect(head).toMatch(/^\d+$/);
  const sbx = await Sandbox.create("base", { ...opts, metadata: { team: "a" }, timeoutMs: 60_000 });
  await sbx.setTimeout(120_000);
  await sbx.updateNetwork({ allowOut: ["1.2.3.4/32", "example.com"], denyOut: ["0.0.0.0/0"] });
  const snap = await sbx.createSnapshot({ name: "ev-snap" });
  const [forked] = await sbx.fork();
  expect(forked).toBeInstanceOf(Sandbox);
  const child = forked as Sandbox;
  await sbx.pause();
  await Sandbox.connect(sbx.sandboxId, opts);
  await sbx.pause({ keepMemory: false });
  await Sandbox.connect(sbx.sandboxId, opts);
  await sbx.kill();
  await child.kill();

  const all = await events(`/events/sandboxes/${sbx.sandboxId}?orderAsc=true&limit=100`);
  expect(all.status).toBe(200);
  const es = all.body;
  expect(types(es)).toEqual(["created", "updated", "updated", "checkpointed", "checkpointed", "paused", "resumed", "paused", "resumed", "killed"]);
  for (const e of es) {
    expect(e).toMatchObject({ version: "v2", eventCategory: "lifecycle", sandboxId: sbx.sandboxId, sandboxTemplateId: "base", sandboxTeamId: TEAM_ID, sandboxBuildId: "" });
    expect(e.id).toMatch(/^[0-9a-f-]{36}$/);
    expect(new Date(e.timestamp).toISOString()).toBe(e.timestamp);
    expect(e.eventData?.sandbox_metadata).toEqual({ team: "a" });
  }
  expect(es.map((e) => e.eventLabel)).toEqual(["create", "update", "update", "checkpoint", "checkpoint", "pause", "resume", "pause", "resume", "kill"]);
  const [created, timeout, network, user, fork, paused1, resumed1, paused2, resumed2, killed] = es as SandboxLifecycleEvent[] & { length: 10 };
  expect(timeout!.eventData!.set_timeout).toMatch(/^\d{4}-\d\d-\d\dT.*Z$/);
  expect(network!.eventData!.network_egress).toEqual({ allowed_cidrs: ["1.2.3.4/32"], denied_cidrs: ["0.0.0.0/0"], allowed_domains: ["example.com"] });
  expect(user!.eventData).toMatchObject({ snapshot_id: snap.snapshotId, purpose: "user" });
  expect(fork!.eventData).toMatchObject({ purpose: "fork" });
  expect(paused1!.eventData).toMatchObject({ snapshot_kind: "memory", pause_reason: "request", execution: { vcpu_count: 1, memory_mb: 512 } });
  expect(paused2!.eventData).toMatchObject({ snapshot_kind: "filesystem", pause_reason: "request" });
  expect(killed!.eventData).toMatchObject({ kill_reason: "request", execution: { vcpu_count: 1, memory_mb: 512 } });
  // one execution id per run: create..pause, resume..pause, resume..kill
  const exec = es.map((e) => e.sandboxExecutionId);
  expect(new Set(exec.slice(0, 6)).size).toBe(1);
  expect(exec[6]).toBe(exec[7]);
  expect(exec[8]).toBe(exec[9]);
  expect(new Set([exec[0], exec[6], exec[8]]).size).toBe(3);
  expect((paused1!.eventData!.execution as { started_at: string }).started_at).toBe(created!.timestamp);
  expect((killed!.eventData!.execution as { started_at: string }).started_at).toBe(resumed2!.timestamp);
  expect((paused2!.eventData!.execution as { execution_time: number }).execution_time).toBe(Date.parse(paused2!.timestamp) - Date.parse(resumed1!.timestamp));

  // E2B defaults: newest first, 10 at a time; offset, types (repeated or comma-separated)
  const dflt = await events(`/events/sandboxes/${sbx.sandboxId}`);
  expect(dflt.body.map((e) => e.id)).toEqual([...es].reverse().map((e) => e.id));
  expect((await events(`/events/sandboxes/${sbx.sandboxId}?limit=3&offset=2`)).body.map((e) => e.id)).toEqual([...es].reverse().slice(2, 5).map((e) => e.id));
  expect(types((await events(`/events/sandboxes/${sbx.sandboxId}?types=sandbox.lifecycle.paused&types=sandbox.lifecycle.killed`)).body)).toEqual(["killed", "paused", "paused"]);
  expect(types((await events(`/events/sandboxes/${sbx.sandboxId}?types=sandbox.lifecycle.created,sandbox.lifecycle.resumed&orderAsc=true`)).body)).toEqual(["created", "resumed", "resumed"]);
  const c = await events(`/events/sandboxes/${child.sandboxId}?orderAsc=true`);
  expect(types(c.body)).toEqual(["created", "forked", "killed"]);
  expect(c.body[1]!.eventData).toMatchObject({ source_sandbox_id: sbx.sandboxId });

  // the feed after the cursor taken before: both sandboxes' events, oldest first, in pages
  const seen: SandboxLifecycleEvent[] = [];
  let cursor = head;
  for (let i = 0; i < 10; i++) {
    const page = await events(`/events/sandboxes?cursor=${cursor}&limit=4`);
    expect(page.status).toBe(200);
    seen.push(...page.body);
    expect(page.cursor).not.toBeNull();
    if (page.body.length === 0) {
      expect(page.cursor).toBe(cursor);
      break;
    }
    cursor = page.cursor!;
  }
  expect(seen.filter((e) => e.sandboxId === sbx.sandboxId).map((e) => e.id)).toEqual(es.map((e) => e.id));
  expect(seen.filter((e) => e.sandboxId === child.sandboxId).map((e) => e.id)).toEqual(c.body.map((e) => e.id));
  expect(seen.length).toBe(es.length + c.body.length);
  const ts = seen.map((e) => Date.parse(e.timestamp));
  expect([...ts].sort((a, b) => a - b)).toEqual(ts);
  expect(types((await events(`/events/sandboxes?cursor=${head}&limit=100&types=sandbox.lifecycle.forked`)).body)).toEqual(["forked"]);

  // bad input: 400 with the E2B error body; an unknown sandbox is 404 "Sandbox events not found"
  for (const q of ["limit=0", "limit=101", "offset=-1", "orderAsc=yes", "types=sandbox.lifecycle.bogus", "cursor=abc"]) {
    const r = await api(node, `/events/sandboxes?${q}`);
    expect({ q, status: r.status, code: ((await r.json()) as { code: number }).code }).toEqual({ q, status: 400, code: 400 });
  }
  const missing = await api(node, "/events/sandboxes/nosuchsandbox");
  expect(missing.status).toBe(404);
  expect(((await missing.json()) as { message: string }).message).toStartWith("Sandbox events not found");
});

test("timeouts: a sandbox past its end is killed with kill_reason timeout; one with autoPause is paused with pause_reason timeout", async () => {
  const k = (await (await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", timeout: 1 }) })).json()) as { sandboxID: string };
  const p = (await (await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", timeout: 1, autoPause: true }) })).json()) as { sandboxID: string };
  expect((await until(k.sandboxID, "killed")).eventData).toMatchObject({ kill_reason: "timeout" });
  expect((await until(p.sandboxID, "paused")).eventData).toMatchObject({ pause_reason: "timeout", snapshot_kind: "memory" });
  await Sandbox.kill(p.sandboxID, opts);
  expect((await until(p.sandboxID, "killed")).eventData).toEqual({ kill_reason: "request" });
});

test("a sandbox whose VM is lost is paused with its files, the event saying why; one whose disk cannot be kept is failed with the error", async () => {
  const lost = await Sandbox.create("base", opts);
  node.runtime!.lose(lost.sandboxId, "disk device removed");
  const paused = await until(lost.sandboxId, "paused");
  expect(paused.eventData).toMatchObject({ pause_reason: "vm_lost", snapshot_kind: "filesystem", error: "disk device removed", execution: { vcpu_count: 1 } });
  const broken = await Sandbox.create("base", opts);
  node.runtime!.failSalvage(broken.sandboxId);
  node.runtime!.lose(broken.sandboxId, "disk device removed");
  const failed = await until(broken.sandboxId, "failed");
  expect(failed.eventData).toMatchObject({ error: `disk device removed; its disk could not be kept: the disk of ${broken.sandboxId} cannot be kept`, failed_in: "pausing", execution: { vcpu_count: 1 } });
});

test("a restart keeps every event and records the sandboxes it found running as killed (orphaned), in the run they had", async () => {
  // a node that died: orchestrator and events over one database, closed without a shutdown
  const home = mkdtempSync(join(tmpdir(), "events-restart-"));
  const world = () => {
    const cfg = loadConfig({ env: { AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run") } });
    const db = openDb(join(home, "node.db"));
    const orch = new Orchestrator(db, new LoopbackRuntime({ base: idleVmRuntime(cfg, db).runtime, templates: ["base"] }), orchestratorConfig(cfg));
    return { db, orch, events: new EventsService(db, eventsConfig(cfg), orch) };
  };
  try {
    // never started: no timer of it outlives its database
    const first = world();
    const running = await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 });
    const paused = await first.orch.create({ template: "base", secure: true, timeoutSecs: 600 });
    await first.orch.pause(paused.id);
    const before = first.events.list({ offset: 0, limit: 100, orderAsc: true, types: [] });
    expect(before.map((e) => `${e.sandboxId === running.id ? "r" : "p"}:${e.type}`)).toEqual([
      "r:sandbox.lifecycle.created",
      "p:sandbox.lifecycle.created",
      "p:sandbox.lifecycle.paused",
    ]);
    await first.events.close();
    first.db.close(); // died: no shutdown kills

    const second = world();
    try {
      await second.orch.start();
      const after = second.events.list({ offset: 0, limit: 100, orderAsc: true, types: [] });
      expect(after.slice(0, before.length)).toEqual(before);
      expect(after.length).toBe(before.length + 1);
      const orphan = after.at(-1)!;
      expect(orphan).toMatchObject({ sandboxId: running.id, type: "sandbox.lifecycle.killed", sandboxExecutionId: before[0]!.sandboxExecutionId });
      expect(orphan.eventData).toMatchObject({ kill_reason: "orphaned", execution: { started_at: before[0]!.timestamp, vcpu_count: 1, memory_mb: 512 } });
      // the paused one stays paused: no event
      expect(second.orch.get(paused.id).state).toBe("paused");
    } finally {
      await second.orch.close();
      await second.events.close();
      second.db.close();
    }
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test("the retention scan deletes events older than [events] retention_hours", async () => {
  const sbx = await Sandbox.create("base", opts);
  await sbx.kill();
  expect((await events(`/events/sandboxes/${sbx.sandboxId}`)).body.length).toBe(2);
  // the scan as it runs a retention later: the store's clock is the node's, so ask with a time
  expect(node.events.events.prune(Date.now() + 1)).toBeGreaterThanOrEqual(2);
  expect((await api(node, `/events/sandboxes/${sbx.sandboxId}`)).status).toBe(404);
  expect((await events("/events/sandboxes")).body).toEqual([]);
});

test("the retention scan taking queued events away does not leave a webhook's queue counted fuller than it is: later events are not dropped for room they have", async () => {
  const home = mkdtempSync(join(tmpdir(), "events-prune-queue-"));
  const cfg = loadConfig({
    env: {
      AENV_HOME_PATH: home,
      AENV_RUNTIME_PATH: join(home, "run"),
      AENV__events__retention_hours: "1",
      AENV__events__webhook_queue_max: "3",
      // one failed try per event head, then a wait past the test
      AENV__events__webhook_retry_initial_ms: "3600000",
      AENV__events__webhook_retry_max_ms: "3600000",
    },
  });
  const db = openDb(join(home, "node.db"));
  const orch = new Orchestrator(db, new LoopbackRuntime({ base: idleVmRuntime(cfg, db).runtime, templates: ["base"] }), orchestratorConfig(cfg));
  let clock = Date.now;
  const svc = new EventsService(db, eventsConfig(cfg), orch, () => clock());
  // a receiver that refuses: every delivery fails, so every event stays queued
  const dead = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const url = `http://127.0.0.1:${dead.port}/`;
  dead.stop(true);
  try {
    const { record } = await svc.putWebhook({ name: "dead", url, events: ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"], signatureSecret: "k" });
    const depth = () => svc.webhooks.queueDepth(record.id);
    const old = await orch.create({ template: "base", secure: true, timeoutSecs: 600 });
    await orch.kill(old.id);
    const oldAt = Date.parse(svc.sandboxEvents(old.id, { offset: 0, limit: 1, orderAsc: false, types: [] })[0]!.timestamp);
    await waitFor("the clock past the old events", () => Date.now() > oldAt);
    const kept = await orch.create({ template: "base", secure: true, timeoutSecs: 600 });
    expect(depth()).toBe(3);
    // an hour after `kept` was created: the old sandbox's two events age out of the queue with them
    const keptAt = Date.parse(svc.sandboxEvents(kept.id, { offset: 0, limit: 1, orderAsc: false, types: [] })[0]!.timestamp);
    clock = () => keptAt + 3_600_000;
    svc.prune();
    expect(svc.list({ offset: 0, limit: 10, orderAsc: true, types: [] }).map((e) => e.sandboxId)).toEqual([kept.id]);
    expect(depth()).toBe(1);
    // room for two more: nothing is dropped
    const next = await orch.create({ template: "base", secure: true, timeoutSecs: 600 });
    await orch.kill(kept.id);
    expect(depth()).toBe(3);
    expect(svc.dispatcher.dropped.get(record.id)).toBeUndefined();
    // full now: the next one drops the oldest waiting
    await orch.kill(next.id);
    expect(depth()).toBe(3);
    expect(svc.dispatcher.dropped.get(record.id)).toBe(1);
  } finally {
    await orch.close();
    await svc.close();
    db.close();
    rmSync(home, { recursive: true, force: true });
  }
});
