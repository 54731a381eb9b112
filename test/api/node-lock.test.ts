import { afterAll, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { bootNode } from "../../src/node/index.ts";
import { acquireNodeLocks, netLockPath } from "../../src/node/lock.ts";
import { AgentEnvError } from "../../src/errors.ts";
import { loadConfig } from "../../src/config/index.ts";
import { testPrefix as newPrefix } from "./helpers.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
const HOLD = join(import.meta.dir, "fixtures/hold-node.ts");
const dirs: string[] = [];
const kids: Bun.Subprocess[] = [];
const prefixes: string[] = [];

/** A fresh network prefix whose host-wide lock file afterAll removes. */
function testPrefix(): string {
  const p = newPrefix();
  prefixes.push(p);
  return p;
}

afterAll(() => {
  for (const k of kids) k.kill("SIGKILL");
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  for (const p of prefixes) rmSync(netLockPath(p), { force: true });
});

function tmp(): string {
  const d = mkdtempSync(join(tmpdir(), "aenv-lock-"));
  dirs.push(d);
  return d;
}

/** Start a VM-free node in a child process; resolves once it listens. */
async function holdNode(home: string, runtimePath: string, prefix: string) {
  const p = Bun.spawn([process.execPath, HOLD, home, runtimePath, prefix], { stdout: "pipe", stderr: "inherit", env: { ...process.env, AENV_LOG_LEVEL: "error" } });
  kids.push(p);
  const reader = p.stdout.getReader();
  let buf = "";
  while (!buf.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`hold-node exited: ${await p.exited}`);
    buf += new TextDecoder().decode(value);
  }
  return { proc: p, ...(JSON.parse(buf) as { url: string; key: string; pid: number }) };
}

function cfgFor(home: string, runtimePath: string, prefix: string) {
  return loadConfig({ env: { AENV_HOME_PATH: home, AENV_RUNTIME_PATH: runtimePath, AENV_API_ADDR: "127.0.0.1:0", AENV_LOG_LEVEL: "error", AENV__network__name_prefix: prefix } });
}

async function health(url: string, key: string): Promise<number> {
  return (await fetch(`${url}/health`, { headers: { "x-api-key": key } })).status;
}

test("a second node on the same runtime path or network prefix is refused before it reaps anything; the first keeps working", async () => {
  const home = tmp();
  const run = join(home, "run");
  const prefix = testPrefix();
  const first = await holdNode(home, run, prefix);
  expect(first.pid).toBe(first.proc.pid);
  expect(await health(first.url, first.key)).toBe(200);
  // a leftover disk record of the first node: start-up reaping would delete it
  mkdirSync(join(run, "disks"), { recursive: true });
  const record = join(run, "disks", "disk-sbxkeep.json");
  writeFileSync(record, "{}");

  // same runtime path (different prefix): in-process boot fails before the runtime is made
  let made = 0;
  const mk = async () => {
    made++;
    throw new Error("runtime must not be made");
  };
  const e1 = await bootNode(cfgFor(tmp(), run, testPrefix()), mk).catch((e) => e);
  expect(e1).toBeInstanceOf(AgentEnvError);
  expect(e1.code).toBe("node.already_running");
  expect(e1.message).toStartWith(`another node is running (pid ${first.pid}) with runtime path ${run} / network prefix ${prefix}`);
  expect(e1.details).toMatchObject({ pid: first.pid, runtimePath: run, namePrefix: prefix, lockPath: join(run, "node.lock") });

  // different runtime path, same prefix: the host-wide lock refuses it
  const otherRun = join(tmp(), "run");
  const e2 = await bootNode(cfgFor(tmp(), otherRun, prefix), mk).catch((e) => e);
  expect(e2.code).toBe("node.already_running");
  expect(e2.details).toMatchObject({ pid: first.pid, runtimePath: run, namePrefix: prefix, lockPath: netLockPath(prefix) });
  expect(made).toBe(0);
  // the refused node left no lock behind: its runtime path is free again
  acquireNodeLocks(otherRun, testPrefix()).release();

  // the real CLI with the real VM runtime: exit 1, one line, nothing reaped
  const p = Bun.spawn([process.execPath, MAIN, "server"], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, AENV_HOME_PATH: tmp(), AENV_RUNTIME_PATH: run, AENV_API_ADDR: "127.0.0.1:0", AENV_LOG_LEVEL: "error", AENV__network__name_prefix: prefix },
  });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  expect(code).toBe(1);
  expect(out).toBe("");
  expect(err).toBe(`agentenv server: another node is running (pid ${first.pid}) with runtime path ${run} / network prefix ${prefix} (lock ${join(run, "node.lock")})\n`);
  expect(existsSync(record)).toBe(true);
  expect(await health(first.url, first.key)).toBe(200);

  // kill -9 releases both locks: a new node starts on the same runtime path and prefix
  first.proc.kill("SIGKILL");
  await first.proc.exited;
  const locks = acquireNodeLocks(run, prefix);
  expect(locks.paths).toEqual([join(run, "node.lock"), netLockPath(prefix)]);
  // while held in this process, a second acquisition (another open file description) is refused
  expect(() => acquireNodeLocks(run, testPrefix())).toThrow(`another node is running (pid ${process.pid})`);
  locks.release();
  rmSync(netLockPath(prefix), { force: true });
}, 60_000);

test("a taken listen address is refused before reaping, and the locks are given back", async () => {
  const blocker = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("x") });
  try {
    const run = join(tmp(), "run");
    const prefix = testPrefix();
    const cfg = loadConfig({ env: { AENV_HOME_PATH: tmp(), AENV_RUNTIME_PATH: run, AENV_API_ADDR: `127.0.0.1:${blocker.port}`, AENV_LOG_LEVEL: "error", AENV__network__name_prefix: prefix } });
    let made = 0;
    const e = await bootNode(cfg, async () => {
      made++;
      throw new Error("no");
    }).catch((x) => x);
    expect(e.code).toBe("node.listen_failed");
    expect(e.message).toContain(`cannot listen on 127.0.0.1:${blocker.port}`);
    expect(made).toBe(0);
    acquireNodeLocks(run, prefix).release();
    rmSync(netLockPath(prefix), { force: true });
  } finally {
    blocker.stop(true);
  }
});

test("an unusable lock directory is a clear error", () => {
  const f = join(tmp(), "file");
  writeFileSync(f, "");
  expect(() => acquireNodeLocks(join(f, "run"), testPrefix())).toThrow(/cannot lock .*node\.lock/);
});
