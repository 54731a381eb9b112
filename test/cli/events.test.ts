/**
 * `agentenv events` (issue 29 item 5) against a real node (SQLite, orchestrator, API; loopback
 * guests), run as the binary's entry point in a child process: the newest events oldest first,
 * one sandbox's, JSON lines, and --follow printing events as they are recorded (the child is
 * stopped by its pid).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { createLoopback, startNodeNoVm, type TestNode } from "../api/helpers.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm({}, undefined, {});
});
afterAll(async () => {
  await node.dispose();
});

function spawn(args: string[]) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(E2B_|AENV_API_(URL|KEY)$)/.test(k)));
  return Bun.spawn([process.execPath, MAIN, "events", "--url", node.url, ...args], { stdout: "pipe", stderr: "pipe", env: { ...env, AENV_LOG_LEVEL: "error", AENV_HOME_PATH: node.home } });
}

async function cli(args: string[]) {
  const p = spawn(args);
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { out, err, code };
}

test("the newest events, oldest first, one line each; --sandbox; --json; clear errors", async () => {
  expect(await cli([])).toMatchObject({ code: 0, out: "", err: "no events\n" });
  const a = await createLoopback(node);
  await node.orch.pause(a.id);
  await node.orch.connect(a.id);
  await node.orch.kill(a.id);
  const b = await createLoopback(node);
  const all = await cli([]);
  expect(all.code).toBe(0);
  const lines = all.out.trimEnd().split("\n");
  expect(lines.map((l) => l.split(/\s+/).slice(1, 3).join(" "))).toEqual([`${a.id} created`, `${a.id} paused`, `${a.id} resumed`, `${a.id} killed`, `${b.id} created`]);
  expect(lines[1]).toMatch(/^\d{4}-\d\d-\d\dT[\d:.]+Z {2}\S+ {2}paused {8}pause_reason=request snapshot_kind=memory ran=\d+\.\ds$/);
  expect(lines[3]).toContain("kill_reason=request");
  const one = await cli(["--sandbox", a.id, "--limit", "2"]);
  expect(one.out.trimEnd().split("\n").map((l) => l.split(/\s+/)[2])).toEqual(["resumed", "killed"]);
  const json = (await cli(["--json", "--sandbox", b.id])).out.trimEnd().split("\n").map((l) => JSON.parse(l) as { type: string; sandboxId: string });
  expect(json).toMatchObject([{ type: "sandbox.lifecycle.created", sandboxId: b.id }]);
  const missing = await cli(["--sandbox", "nosuch"]);
  expect([missing.code, missing.err]).toEqual([1, expect.stringContaining("404")]);
  expect((await cli(["--limit", "0"])).err).toContain("--limit must be an integer between 1 and 100");
  await node.orch.kill(b.id);
});

test("--follow prints each new event as it is recorded, of one sandbox with --sandbox", async () => {
  const p = spawn(["--follow", "--interval", "50", "--limit", "1"]);
  const q = spawn(["--follow", "--interval", "50", "--sandbox", "willbecreated"]);
  const reader = p.stdout.getReader();
  let out = "";
  const read = async (want: (s: string) => boolean) => {
    const end = Date.now() + 20_000;
    while (!want(out)) {
      if (Date.now() > end) throw new Error(`no such output: ${out}`);
      const r = await reader.read();
      if (r.done) throw new Error(`exited: ${out}`);
      out += new TextDecoder().decode(r.value);
    }
  };
  try {
    // the newest event first (the last kill of the test before), then nothing until something happens
    await read((s) => s.split("\n").length >= 2);
    const c = await createLoopback(node);
    await read((s) => s.includes(`${c.id}  created`));
    await node.orch.kill(c.id);
    await read((s) => s.includes(`${c.id}  killed`));
    const lines = out.trimEnd().split("\n");
    expect(lines.slice(1).map((l) => l.split(/\s+/).slice(1, 3).join(" "))).toEqual([`${c.id} created`, `${c.id} killed`]);
  } finally {
    p.kill();
    q.kill();
    await p.exited;
    await q.exited;
  }
  // the sandbox-filtered follower printed nothing of other sandboxes
  expect(await new Response(q.stdout).text()).toBe("");
});
