/**
 * Filesystem-only snapshots without VMs (sandboxes run as loopback guests): what the orchestrator
 * asks the runtime for (pause and resume with or without memory, a guest flush first), what it
 * records (snapshotKind), the timeout's pause with autoPauseMemory:false, the create refusal of
 * autoPauseMemory:false + autoResume, and the proxy not resuming such a sandbox on traffic. The
 * real cold boot is test/e2e/parity.test.ts.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { api, createLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";
import { waitFor } from "../helpers/wait.ts";

let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm({}, undefined, {});
});
afterAll(async () => {
  await node.dispose();
});

async function json(res: Response): Promise<{ status: number; body: any }> {
  return { status: res.status, body: res.status === 204 ? null : await res.json() };
}
const post = (path: string, body: unknown) => api(node, path, { method: "POST", body: JSON.stringify(body) });
const callsOf = (id: string) => node.runtime!.calls.filter((c) => c.includes(id) && !c.startsWith("start"));

test("pause {memory:false} keeps only the disk; connect cold-boots it; memory pauses restore unless connect says memory:false", async () => {
  const { id } = await createLoopback(node);
  expect((await post(`/sandboxes/${id}/pause`, { memory: false })).status).toBe(204);
  expect(node.orch.get(id)).toMatchObject({ state: "paused", snapshotKind: "filesystem" });
  // a connect asking for memory gets a cold boot anyway: there is none
  expect((await post(`/v2/sandboxes/${id}/connect`, {})).status).toBe(201);
  expect(node.orch.get(id)).toMatchObject({ state: "running", snapshotKind: null });
  expect((await post(`/sandboxes/${id}/pause`, {})).status).toBe(204);
  expect(node.orch.get(id).snapshotKind).toBe("memory");
  expect((await post(`/sandboxes/${id}/connect`, { timeout: 60 })).status).toBe(201);
  expect((await post(`/sandboxes/${id}/pause`, { memory: true })).status).toBe(204);
  expect((await post(`/v2/sandboxes/${id}/connect`, { memory: false })).status).toBe(201);
  expect((await post(`/sandboxes/${id}/pause`, { memory: false })).status).toBe(204);
  expect((await post(`/sandboxes/${id}/resume`, { timeout: 60 })).status).toBe(201);
  expect(callsOf(id)).toEqual([
    `quiesce:${id}`,
    `pause:${id}:fs`,
    `resume:${id}:fs`,
    `pause:${id}`,
    `resume:${id}`,
    `pause:${id}`,
    `resume:${id}:fs`,
    `quiesce:${id}`,
    `pause:${id}:fs`,
    `resume:${id}:fs`,
  ]);
  const logs = (await json(await api(node, `/v2/sandboxes/${id}/logs?search=cold`))).body.logs;
  expect(logs.map((l: any) => l.message)).toEqual(Array(3).fill("sandbox cold-booted on its disk (no memory restored)"));
  await node.orch.kill(id);
});

test("the timeout's pause follows autoPauseMemory; autoPauseMemory:false with autoResume is a 400", async () => {
  const a = await createLoopback(node, { autoPause: true, autoPauseMemory: false, timeoutSecs: 1 });
  const b = await createLoopback(node, { autoPause: true, timeoutSecs: 1 });
  await waitFor("both timeouts' pauses", () => [a.id, b.id].every((id) => node.orch.get(id).state === "paused"));
  expect(node.orch.get(a.id).snapshotKind).toBe("filesystem");
  expect(node.orch.get(b.id).snapshotKind).toBe("memory");
  expect(callsOf(a.id)).toEqual([`quiesce:${a.id}`, `pause:${a.id}:fs`]);
  expect(callsOf(b.id)).toEqual([`pause:${b.id}`]);
  for (const path of ["/v2/sandboxes", "/sandboxes"]) {
    const r = await json(await post(path, { templateID: "base", autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } }));
    expect(r.status).toBe(400);
    expect(r.body).toMatchObject({ code: 400, error_code: "orchestrator.bad_request", message: expect.stringContaining("autoPauseMemory: false cannot be combined with autoResume") });
  }
  await node.orch.kill(a.id);
  await node.orch.kill(b.id);
});

test("proxy traffic resumes a paused autoResume sandbox from memory, never from a filesystem-only snapshot", async () => {
  const cold = await createLoopback(node, { autoResume: true });
  const warm = await createLoopback(node, { autoResume: true });
  await node.orch.pause(cold.id, { memory: false });
  await node.orch.pause(warm.id);
  const hdr = (id: string) => ({ "E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983" });
  const r1 = await fetch(`${node.url}/health`, { headers: hdr(cold.id) });
  expect(r1.status).toBe(502);
  expect(((await r1.json()) as any).message).toContain("filesystem-only snapshot");
  expect(node.orch.get(cold.id).state).toBe("paused");
  const r2 = await fetch(`${node.url}/health`, { headers: hdr(warm.id) });
  expect(r2.status).toBe(204);
  expect(node.orch.get(warm.id).state).toBe("running");
  expect(callsOf(cold.id)).toEqual([`quiesce:${cold.id}`, `pause:${cold.id}:fs`]);
  expect(callsOf(warm.id)).toEqual([`pause:${warm.id}`, `resume:${warm.id}`]);
  await node.orch.kill(cold.id);
  await node.orch.kill(warm.id);
});
