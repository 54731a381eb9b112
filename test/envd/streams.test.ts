/**
 * Command streams outlive their client (issue 27 item 5), with the unmodified e2b@2.51.0 SDK:
 * a client (fixtures/sdk-client.ts, a process of its own) starts a background command that
 * prints a numbered line every 50 ms and is SIGKILLed mid-stream (its TCP connection is closed
 * by the kernel, as when the node in between dies). The process lives on; `commands.list()`
 * shows it; `commands.connect(pid)` first gets the output written while nobody listened (kept
 * in a bounded buffer: `[envd] detached_output_bytes`), then the live output, with no line
 * missing. Once directly against envd, once through a node's sandbox proxy.
 * Real parts: envd child process, a node (API + proxy, loopback guests) for the second case.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chownSync, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { Sandbox } from "e2b";
import { ENVD_VERSION } from "../../src/envd/version.ts";
import { createLoopback, startNodeNoVm, type TestNode } from "../api/helpers.ts";
import { ensureUserAccount, initEnvd, startEnvdChild, type EnvdChild } from "./harness.ts";
import { waitFor } from "../helpers/wait.ts";

const TOKEN = "b".repeat(24) + "0123456789abcdef";
let dir: string;
let userIds: { uid: number; gid: number };
const kill: (() => Promise<void> | void)[] = [];

beforeAll(() => {
  userIds = ensureUserAccount();
  dir = mkdtempSync("/tmp/envd-streams-");
  chownSync(dir, userIds.uid, userIds.gid);
});
afterAll(async () => {
  for (const k of kill.reverse()) await k();
  rmSync(dir, { recursive: true, force: true });
});

/** A command printing `line <n>` every 50 ms and writing the last n to `file`. */
function counter(file: string): string {
  return `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo "line $i"; echo $i > ${file}; sleep 0.05; done`;
}

/** The line numbers in `text` (`line <n>`). */
function numbers(text: string): number[] {
  return [...text.matchAll(/line (\d+)/g)].map((m) => Number(m[1]));
}

/** Run the client until it printed `minLines` lines, then SIGKILL it; returns the pid and the last line number it saw. */
async function clientCutMidStream(opts: Record<string, unknown>, id: string, cmd: string, minLines: number): Promise<{ pid: number; lastSeen: number }> {
  const client = Bun.spawn([process.execPath, join(import.meta.dir, "fixtures", "sdk-client.ts"), JSON.stringify(opts), id, cmd], { stdout: "pipe", stderr: "inherit" });
  kill.push(() => void client.kill("SIGKILL"));
  const reader = client.stdout.getReader();
  let text = "";
  let pid = 0;
  let out = "";
  while (!pid || numbers(out).length < minLines) {
    const r = await reader.read();
    if (r.done) throw new Error(`client ended early: ${text}`);
    text += new TextDecoder().decode(r.value);
    const lines = text.split("\n");
    text = lines.pop()!;
    for (const l of lines) {
      const m = JSON.parse(l) as { pid?: number; out?: string };
      if (m.pid) pid = m.pid;
      if (m.out) out += m.out;
    }
  }
  client.kill("SIGKILL");
  await client.exited;
  const seen = numbers(out);
  for (let i = 1; i < seen.length; i++) expect(seen[i]).toBe(seen[i - 1]! + 1);
  return { pid, lastSeen: seen.at(-1)! };
}

/** The cut, then list, then connect: what a reconnecting client gets. */
async function reconnectAfterCut(sbx: Sandbox, opts: Record<string, unknown>, file: string): Promise<void> {
  const { pid, lastSeen } = await clientCutMidStream(opts, sbx.sandboxId, counter(file), 5);
  // the process goes on with nobody listening
  const written = () => Number(readFileSync(file, "utf8").trim() || 0);
  await waitFor("written() >= lastSeen + 20", () => written() >= lastSeen + 20, { timeoutMs: 20_000 });
  const listed = await sbx.commands.list();
  expect(listed.map((p) => p.pid)).toContain(pid);
  const atConnect = written();
  let got = "";
  const h = await sbx.commands.connect(pid, { onStdout: (d) => void (got += d), timeoutMs: 0 });
  await waitFor("numbers(got).length > atConnect - lastSeen + 10", () => numbers(got).length > atConnect - lastSeen + 10, { timeoutMs: 20_000 });
  const after = numbers(got);
  // nothing the client saw comes again; what was written while nobody listened comes first,
  // then the live output: no line missing
  expect(after[0]!).toBeGreaterThan(lastSeen);
  expect(after[0]!).toBeLessThanOrEqual(atConnect - 15);
  for (let i = 1; i < after.length; i++) expect(after[i]).toBe(after[i - 1]! + 1);
  expect(after.at(-1)!).toBeGreaterThan(atConnect);
  await h.kill();
  const end = await h.wait().catch((e) => e);
  expect(end.exitCode).toBe(-1);
  expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(pid);
}

describe("command streams outlive their client", () => {
  test("directly against envd: the client is killed mid-stream; list shows the process, connect streams what it wrote since", async () => {
    const envd: EnvdChild = await startEnvdChild();
    kill.push(() => envd.stop());
    expect((await initEnvd(envd.url, { accessToken: TOKEN, defaultUser: "user" })).status).toBe(204);
    const sandboxJson = { sandboxID: "sbxstreams", templateID: "base", clientID: "6532622b", envdVersion: ENVD_VERSION, envdAccessToken: TOKEN };
    const api = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch: (req) => (new URL(req.url).pathname === "/v2/sandboxes/sbxstreams/connect" ? Response.json(sandboxJson) : Response.json({ code: 404, message: "stub" }, { status: 404 })),
    });
    kill.push(() => void api.stop(true));
    const opts = { apiKey: "e2b_0123456789abcdef", apiUrl: `http://127.0.0.1:${api.port}`, sandboxUrl: envd.url, requestTimeoutMs: 20_000 };
    const sbx = await Sandbox.connect("sbxstreams", opts);
    await reconnectAfterCut(sbx, opts, join(dir, "direct.n"));
  }, 120_000);

  test("through a node's sandbox proxy: the client's connection is cut mid-stream; connect through the node streams on", async () => {
    const node: TestNode = await startNodeNoVm({}, undefined, { ports: [3000] });
    kill.push(() => node.dispose());
    const rec = await createLoopback(node);
    const envd = await startEnvdChild(undefined, {}, [], { host: node.runtime!.hostOf(rec.id)!, port: 49983 });
    kill.push(() => envd.stop());
    expect((await initEnvd(envd.url, { accessToken: rec.envdAccessToken, defaultUser: "user" })).status).toBe(204);
    const opts = { apiKey: node.apiKey, apiUrl: node.url, sandboxUrl: node.url, requestTimeoutMs: 20_000 };
    const sbx = await Sandbox.connect(rec.id, opts);
    await reconnectAfterCut(sbx, opts, join(dir, "proxy.n"));
  }, 120_000);

  test("the kept output is bounded: the newest detached_output_bytes of it come first; 0 keeps none (E2B's envd behaviour)", async () => {
    const expected = Array.from({ length: 20000 }, (_, i) => `${i + 1}\n`).join("");
    for (const bound of [4096, 0]) {
      const envd = await startEnvdChild(undefined, { AENV__envd__detached_output_bytes: String(bound) });
      kill.push(() => envd.stop());
      expect((await initEnvd(envd.url, { accessToken: TOKEN, defaultUser: "user" })).status).toBe(204);
      const sandboxJson = { sandboxID: "sbxbound", templateID: "base", clientID: "6532622b", envdVersion: ENVD_VERSION, envdAccessToken: TOKEN };
      const api = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => Response.json(sandboxJson) });
      kill.push(() => void api.stop(true));
      const sbx = await Sandbox.connect("sbxbound", { apiKey: "e2b_0123456789abcdef", apiUrl: `http://127.0.0.1:${api.port}`, sandboxUrl: envd.url });
      const done = join(dir, `done-${bound}`);
      // the client goes away (the SDK's own disconnect) before the command writes anything
      const h = await sbx.commands.run(`sleep 1; seq 1 20000; touch ${done}; sleep 600`, { background: true, timeoutMs: 0 });
      await h.disconnect();
      await waitFor("existsSync(done)", () => existsSync(done), { timeoutMs: 20_000 });
      let got = "";
      const again = await sbx.commands.connect(h.pid, { onStdout: (d) => void (got += d), timeoutMs: 0 });
      if (bound > 0) {
        await waitFor("got.endsWith(\"20000\\n\")", () => got.endsWith("20000\n"), { timeoutMs: 10_000 });
        expect(got.length).toBeGreaterThan(0);
        expect(got.length).toBeLessThanOrEqual(bound);
        expect(expected.endsWith(got)).toBe(true);
      } else {
        // nothing was kept: a marker written after the connect is the first thing it gets
        await sbx.commands.run(`echo marker > /proc/${h.pid}/fd/1`, { user: "root" });
        await waitFor("got.length > 0", () => got.length > 0, { timeoutMs: 10_000 });
        expect(got).toBe("marker\n");
      }
      await again.kill();
    }
  }, 120_000);
});
