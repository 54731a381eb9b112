/**
 * The scheduler and the gateway run from the single `bun build --compile` binary: `agentenv
 * scheduler` serves gRPC (migrations embedded), `agentenv gateway` answers through it and
 * serves the console bundled into the binary, and `agentenv deploy render` works without the
 * source tree.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { createClient } from "nice-grpc";
import { SchedulerDefinition, schedulerChannel } from "../../src/cluster/index.ts";

const ROOT = join(import.meta.dir, "../..");
const tmp = mkdtempSync("/tmp/aenv-bin-cluster-");
const bin = join(tmp, "agentenv");
const procs: Subprocess[] = [];

beforeAll(async () => {
  const b = Bun.spawn(["bun", "build", "--compile", join(ROOT, "src/cli/main.ts"), "--outfile", bin], { stdout: "pipe", stderr: "pipe", cwd: ROOT });
  if ((await b.exited) !== 0) throw new Error(`bun build failed: ${await new Response(b.stderr).text()}`);
}, 120_000);

afterAll(async () => {
  for (const p of procs) {
    p.kill("SIGKILL");
    await p.exited;
  }
  rmSync(tmp, { recursive: true, force: true });
});

/** Start the binary and wait for a stdout line matching `re`. */
async function run(args: string[], env: Record<string, string>, re: RegExp): Promise<RegExpExecArray> {
  const p = Bun.spawn([bin, ...args], { env: { ...(process.env as Record<string, string>), AENV_LOG_LEVEL: "error", ...env }, stdout: "pipe", stderr: "pipe" });
  procs.push(p);
  const reader = p.stdout.getReader();
  let out = "";
  for (;;) {
    const m = re.exec(out);
    if (m) return m;
    const r = await reader.read();
    if (r.done) throw new Error(`${args[0]} exited: ${out} ${await new Response(p.stderr).text()}`);
    out += new TextDecoder().decode(r.value);
  }
}

test("compiled agentenv: scheduler + gateway + deploy render", async () => {
  const s = await run(["scheduler"], { AENV_HOME_PATH: join(tmp, "s"), AENV__scheduler__addr: "127.0.0.1:0", AENV__scheduler__nodes: "n1=http://127.0.0.1:1" }, /listening on 127\.0\.0\.1:(\d+)/);
  const client = createClient(SchedulerDefinition, schedulerChannel(`127.0.0.1:${s[1]}`));
  expect((await client.listNodes({})).nodes).toEqual([{ nodeId: "n1", endpoint: "http://127.0.0.1:1" }]);
  const g = await run(["gateway"], { AENV_HOME_PATH: join(tmp, "g"), AENV__gateway__addr: "127.0.0.1:0", AENV__cluster__scheduler_endpoint: `127.0.0.1:${s[1]}` }, /E2B SDK: E2B_API_URL=(\S+) E2B_SANDBOX_URL=\S+ E2B_API_KEY=(e2b_[0-9a-f]{40})/);
  expect(((await (await fetch(`${g[1]}/health`)).json()) as any).role).toBe("gateway");
  // the console: its page and every file it names come from the binary
  const page = await (await fetch(`${g[1]}/console/`)).text();
  expect(page).toContain('data-role="gateway"');
  const files = [...page.matchAll(/\/console\/assets\/[^"]+/g)].map((m) => m[0]);
  expect(files.length).toBe(2);
  for (const f of files) {
    const r = await fetch(g[1] + f);
    expect(r.status).toBe(200);
    if (f.endsWith(".js")) expect(await r.text()).toContain("agentenv.apiKey");
  }
  // the only node is down: a list and a create fail 502 naming it
  const l = await fetch(`${g[1]}/v2/sandboxes`, { headers: { "x-api-key": g[2]! } });
  expect(l.status).toBe(502);
  expect(((await l.json()) as any).message).toContain("node n1 (http://127.0.0.1:1) is unreachable");
  const c = await fetch(`${g[1]}/v2/sandboxes`, { method: "POST", headers: { "x-api-key": g[2]!, "content-type": "application/json" }, body: JSON.stringify({ templateID: "base" }) });
  expect(c.status).toBe(502);
  expect(((await c.json()) as any).message).toContain("node n1 (http://127.0.0.1:1) is unreachable");
  const r = Bun.spawnSync([bin, "deploy", "render"], { stdout: "pipe" });
  expect(r.exitCode).toBe(0);
  expect(r.stdout.toString()).toContain("kind: DaemonSet");
}, 60_000);
