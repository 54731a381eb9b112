import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { createLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";
import { mkdirSync, writeFileSync } from "node:fs";
import { defaultNodeUrl, table } from "../../src/cli/node-client.ts";
import { connectEnvelope } from "../../src/cli/sandbox.ts";
import { writeManifest } from "../../src/template/index.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm({}, undefined, {});
});
afterAll(async () => {
  await node.dispose();
});

function cli(args: string[], env: Record<string, string> = {}) {
  return cliOn(node, args, env);
}

async function cliOn(node: TestNode, args: string[], env: Record<string, string> = {}) {
  // other test files in this process point the SDK variables at their own nodes
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(E2B_|AENV_API_(URL|KEY)$)/.test(k)));
  const p = Bun.spawn([process.execPath, MAIN, ...args], { stdout: "pipe", stderr: "pipe", env: { ...inherited, AENV_LOG_LEVEL: "error", AENV_HOME_PATH: node.home, ...env } });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { out, err, code };
}

test("sandbox list/kill talk to the node; the key comes from $home_path/api-key when not given", async () => {
  const url = ["--url", node.url];
  expect(await cli(["sandbox", "list", ...url])).toMatchObject({ code: 0, out: "no sandboxes\n" });
  const id = (await createLoopback(node, { metadata: { team: "x" } })).id;
  const l = await cli(["sandbox", "list", ...url]);
  expect(l.code).toBe(0);
  const lines = l.out.trimEnd().split("\n");
  expect(lines[0]).toMatch(/^SANDBOX ID\s+TEMPLATE\s+STATE\s+CPU\s+MEM MiB\s+STARTED\s+EXPIRES IN\s+METADATA$/);
  expect(lines[1]).toMatch(new RegExp(`^${id}\\s+base\\s+running`));
  expect(lines[1]).toMatch(/^\S+\s+base\s+running\s+1\s+512\s+\S+ \S+\s+\d+s\s+team=x$/);
  const j = JSON.parse((await cli(["sandbox", "list", ...url, "--json"])).out);
  expect(j.map((s: { sandboxID: string }) => s.sandboxID)).toEqual([id]);
  expect(await cli(["sandbox", "kill", id, ...url])).toMatchObject({ code: 0, out: `killed ${id}\n` });
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

test("leaf --help names the full command: agentenv sandbox exec, agentenv template list", async () => {
  const strip = (t: string) => t.replace(/\x1b\[[0-9;]*m/g, "");
  const usage = async (args: string[]) => {
    const r = await cli([...args, "--help"], { NO_COLOR: "1" });
    expect(r.code).toBe(0);
    return strip(r.out).split("\n").find((l) => l.startsWith("USAGE"));
  };
  expect(await usage(["sandbox", "exec"])).toBe("USAGE agentenv sandbox exec [OPTIONS] <ID> <COMMAND>");
  expect(await usage(["sandbox", "list"])).toBe("USAGE agentenv sandbox list [OPTIONS] ");
  expect(await usage(["template", "list"])).toBe("USAGE agentenv template list [OPTIONS] ");
  expect(await usage(["sandbox"])).toBe("USAGE agentenv sandbox create|list|exec|pause|resume|connect|logs|metrics|snapshot|fork|kill");
  expect(await usage([])).toStartWith("USAGE agentenv version|");
});

test("template list asks the node (GET /templates): 'no templates', then a table with a header; --json; bad key", async () => {
  // a node of its own whose guests bring no template
  const node = await startNodeNoVm({}, undefined, {});
  try {
    await templateList(node);
  } finally {
    await node.dispose();
  }
});

async function templateList(node: TestNode): Promise<void> {
  const cli = (args: string[]) => cliOn(node, args);
  const url = ["--url", node.url];
  expect(await cli(["template", "list", ...url])).toMatchObject({ code: 0, out: "no templates\n" });
  const dir = join(node.home, "templates", "clitpl");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "rootfs.ext4"), Buffer.alloc(0));
  writeManifest(node.home, { name: "clitpl", rootfs: "rootfs.ext4", layers: [], bootArgs: "root=/dev/vda", diskBytes: 1024 * 1024 * 1024, buildKey: "k".repeat(40), createdAt: "2026-11-29T10:00:00.000Z" });
  const l = await cli(["template", "list", ...url]);
  expect(l.code).toBe(0);
  const lines = l.out.trimEnd().split("\n");
  expect(lines).toHaveLength(2);
  expect(lines[0]).toMatch(/^TEMPLATE ID\s+ALIASES\s+STATUS\s+CPU\s+MEM MiB\s+DISK MiB\s+SPAWNS\s+LAST SPAWNED\s+CREATED$/);
  expect(lines[1]).toMatch(/^clitpl\s+clitpl\s+ready\s+1\s+512\s+1024\s+0\s+-\s+2026-11-29 10:00:00$/);
  const j = JSON.parse((await cli(["template", "list", ...url, "--json"])).out);
  expect(j.map((t: { templateID: string }) => t.templateID)).toEqual(["clitpl"]);
  const w = await cli(["template", "list", ...url, "--key", "e2b_wrong"]);
  expect(w.code).toBe(1);
  expect(w.err).toStartWith("error: GET /templates: 401 ");
}

test("the default node URL comes from AENV_API_ADDR (a wildcard host means 127.0.0.1)", async () => {
  expect(defaultNodeUrl("0.0.0.0:49982")).toBe("http://127.0.0.1:49982");
  expect(defaultNodeUrl(":8080")).toBe("http://127.0.0.1:8080");
  expect(defaultNodeUrl("[::]:8080")).toBe("http://127.0.0.1:8080");
  expect(defaultNodeUrl("[::1]:8080")).toBe("http://[::1]:8080");
  expect(defaultNodeUrl("10.1.2.3:80")).toBe("http://10.1.2.3:80");
  expect(() => defaultNodeUrl("nope")).toThrow('invalid [api] addr / AENV_API_ADDR "nope"');
  const clean = { AENV_API_URL: "", E2B_API_URL: "" };
  const ok = await cli(["sandbox", "list"], { ...clean, AENV_API_ADDR: `0.0.0.0:${node.port}` });
  expect(ok.code).toBe(0);
  expect(ok.out).toMatch(/^(no sandboxes|SANDBOX ID)/);
  const t = await cli(["template", "list", "--json"], { ...clean, AENV_API_ADDR: `127.0.0.1:${node.port}` });
  expect(t.code).toBe(0);
  expect(Array.isArray(JSON.parse(t.out))).toBe(true);
  const off = await cli(["sandbox", "list"], { ...clean, AENV_API_ADDR: "0.0.0.0:9" });
  expect(off.code).toBe(1);
  expect(off.err).toContain("cannot reach the node at http://127.0.0.1:9");
});
