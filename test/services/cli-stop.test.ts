/**
 * How `agentenv scheduler` and `agentenv gateway` (run from source, as `cluster up` runs its
 * members) stop: SIGTERM, and — with AENV_STOP_ON_STDIN_EOF=1 — the end of stdin, which is what
 * a member sees when the `cluster up` that started it dies (even by SIGKILL). Both exit 0.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
const tmp = mkdtempSync("/tmp/aenv-cli-stop-");
const procs: Subprocess[] = [];
afterAll(async () => {
  for (const p of procs) {
    p.kill("SIGKILL");
    await p.exited;
  }
  rmSync(tmp, { recursive: true, force: true });
});

/** Start `agentenv <args>` with stdin a pipe; resolves once stdout matches `ready`. */
async function start(args: string[], env: Record<string, string>, ready: RegExp): Promise<{ p: Subprocess<"pipe", "pipe", "pipe">; m: RegExpExecArray }> {
  const p = Bun.spawn([process.execPath, MAIN, ...args], { env: { ...(process.env as Record<string, string>), AENV_LOG_LEVEL: "error", ...env }, stdin: "pipe", stdout: "pipe", stderr: "pipe" });
  procs.push(p);
  const reader = p.stdout.getReader();
  let out = "";
  for (;;) {
    const m = ready.exec(out);
    if (m) {
      reader.releaseLock();
      return { p, m };
    }
    const r = await reader.read();
    if (r.done) throw new Error(`${args[0]} exited: ${out} ${await new Response(p.stderr).text()}`);
    out += new TextDecoder().decode(r.value);
  }
}

test("the end of stdin stops a scheduler and a gateway started with AENV_STOP_ON_STDIN_EOF=1; SIGTERM stops them too", async () => {
  const eof = { AENV_STOP_ON_STDIN_EOF: "1" };
  const s = await start(["scheduler"], { ...eof, AENV_HOME_PATH: join(tmp, "s"), AENV__scheduler__addr: "127.0.0.1:0", AENV__scheduler__nodes: "n1=http://127.0.0.1:1" }, /listening on 127\.0\.0\.1:(\d+)/);
  const g = await start(["gateway"], { ...eof, AENV_HOME_PATH: join(tmp, "g"), AENV__gateway__addr: "127.0.0.1:0", AENV__cluster__scheduler_endpoint: `127.0.0.1:${s.m[1]}` }, /E2B SDK: E2B_API_URL=(\S+)/);
  expect((await fetch(`${g.m[1]}/health`)).status).toBe(200);
  // the parent is gone: its end of the pipe closes
  await g.p.stdin.end();
  await s.p.stdin.end();
  expect(await Promise.all([g.p.exited, s.p.exited])).toEqual([0, 0]);
  // without the variable, stdin's end means nothing; SIGTERM stops it
  const plain = await start(["scheduler"], { AENV_HOME_PATH: join(tmp, "s2"), AENV__scheduler__addr: "127.0.0.1:0" }, /listening on 127\.0\.0\.1:(\d+)/);
  await plain.p.stdin.end();
  const client = await fetch(`http://127.0.0.1:${s.m[1]}`).catch((e) => e);
  expect(client).toBeInstanceOf(Error); // the first scheduler's port is closed
  expect(plain.p.exitCode).toBeNull();
  plain.p.kill("SIGTERM");
  expect(await plain.p.exited).toBe(0);
}, 30_000);
