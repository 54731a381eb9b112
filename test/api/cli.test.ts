import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { adoptLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";
import { connectEnvelope, table } from "../../src/cli/sandbox.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm();
});
afterAll(async () => {
  await node.dispose();
});

async function cli(args: string[], env: Record<string, string> = {}) {
  const p = Bun.spawn([process.execPath, MAIN, ...args], { stdout: "pipe", stderr: "pipe", env: { ...process.env, AENV_LOG_LEVEL: "error", AENV_HOME_PATH: node.home, ...env } });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { out, err, code };
}

test("sandbox list/kill talk to the node; the key comes from $home_path/api-key when not given", async () => {
  const url = ["--url", node.url];
  expect(await cli(["sandbox", "list", ...url])).toMatchObject({ code: 0, out: "no sandboxes\n" });
  adoptLoopback(node, "clisbx1", {}, { metadata: { team: "x" } });
  const l = await cli(["sandbox", "list", ...url]);
  expect(l.code).toBe(0);
  const lines = l.out.trimEnd().split("\n");
  expect(lines[0]).toMatch(/^SANDBOX ID\s+TEMPLATE\s+STATE\s+CPU\s+MEM MiB\s+STARTED\s+EXPIRES IN\s+METADATA$/);
  expect(lines[1]).toMatch(/^clisbx1\s+base\s+running\s+1\s+512\s+\S+ \S+\s+\d+s\s+team=x$/);
  const j = JSON.parse((await cli(["sandbox", "list", ...url, "--json"])).out);
  expect(j.map((s: { sandboxID: string }) => s.sandboxID)).toEqual(["clisbx1"]);
  expect(await cli(["sandbox", "kill", "clisbx1", ...url])).toMatchObject({ code: 0, out: "killed clisbx1\n" });
});

test("clear errors: unknown sandbox, wrong key, unknown template, unreachable node, bad flags", async () => {
  const url = ["--url", node.url];
  const k = await cli(["sandbox", "kill", "nosuch", ...url]);
  expect(k.code).toBe(1);
  expect(k.err).toContain("error: DELETE /sandboxes/nosuch: 404");
  const w = await cli(["sandbox", "list", ...url, "--key", "e2b_wrong"]);
  expect(w.code).toBe(1);
  expect(w.err).toContain("401");
  const t = await cli(["sandbox", "create", "nope", ...url]);
  expect(t.code).toBe(1);
  expect(t.err).toContain("template 'nope' not found");
  const u = await cli(["sandbox", "list", "--url", "http://127.0.0.1:9"]);
  expect(u.code).toBe(1);
  expect(u.err).toContain("cannot reach the node at http://127.0.0.1:9");
  const b = await cli(["sandbox", "create", "base", ...url, "--timeout", "soon"]);
  expect(b.code).toBe(1);
  expect(b.err).toContain("--timeout must be a whole number of seconds");
  const e = await cli(["sandbox", "create", "base", ...url, "--env", "NOEQUALS"]);
  expect(e.err).toContain("--env must be KEY=VALUE");
});

test("table aligns columns; Connect envelopes carry a big-endian length", () => {
  expect(table(["A", "BB"], [["xxx", "y"], ["z", ""]])).toBe("A    BB\nxxx  y\nz");
  const env = connectEnvelope({ a: 1 });
  expect([...env.subarray(0, 5)]).toEqual([0, 0, 0, 0, 7]);
  expect(new TextDecoder().decode(env.subarray(5))).toBe('{"a":1}');
});
